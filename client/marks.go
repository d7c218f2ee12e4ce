package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"

	"github.com/agentrunner/runner/wire"
)

// Marks calls GET .../marks: one page of stream's offset-time marks, from
// the mark covering byte from (the last at or before it) on, at most
// wire.MaxMarks; Next, when set, is the from of the next page. A stream
// the journal never wrote has no marks. Each mark's Time is when the
// write at its Offset happened, as runnerd's journal recorded it: the
// bytes up to the next mark were written at or after it and within
// GranularityMS of it.
func (c *Client) Marks(ctx context.Context, sandbox, id, stream string, from int64) (wire.Marks, error) {
	if from < 0 {
		return wire.Marks{}, invalidf("marks from %d: want a byte offset >= 0", from)
	}
	q := url.Values{"stream": {stream}, wire.QueryFrom: {strconv.FormatInt(from, 10)}}
	var m wire.Marks
	err := c.do(ctx, call{method: http.MethodGet, path: apiPath("sandboxes", sandbox, "sessions", id, "marks"), query: q}, &m)
	return m, err
}
