package daemon

import (
	"net/http"
	"net/url"
	"strconv"

	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/journal"
)

// parseCursor reads a byte-offset cursor from the query; absent is 0.
func parseCursor(r *http.Request, key string) (int64, error) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return 0, errInvalid("query: %v", err)
	}
	v := q.Get(key)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, errInvalid("cursor %s=%q: want a non-negative byte offset", key, v)
	}
	return n, nil
}

// openJournal opens the session's journal for reading.
func (s *server) openJournal(ss registry.Session) (*journal.Journal, error) {
	j, err := journal.Open(journalDir(s.sessionDir(ss)))
	if err != nil {
		return nil, errUnavailable("open journal: %v", err)
	}
	return j, nil
}

// openReader opens one stream at cursor; cursor errors become truncated
// (416) or invalid (400).
func openReader(j *journal.Journal, stream string, cursor int64, follow bool) (*journal.Reader, error) {
	rd, err := j.NewReader(stream, cursor, follow)
	if err != nil {
		return nil, err
	}
	return rd, nil
}
