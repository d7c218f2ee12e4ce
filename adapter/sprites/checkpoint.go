package sprites

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/hosted/httpcall"
)

// The checkpoint API, from superfly/sprites-go (checkpoint.go, types.go)
// and the checkpoints concept page: POST /v1/sprites/{name}/checkpoint
// {comment} streams NDJSON progress ({type, data, error}) and names the
// new checkpoint only in its text, at the end; GET .../checkpoints is a
// bare JSON array of {id, create_time, comment, history, is_auto}; GET
// .../checkpoints/{id} is one; POST .../checkpoints/{id}/restore streams
// NDJSON too, and the restore is asynchronous: the sprite restarts and
// every session ends.

// Checkpoint is one entry of GET /v1/sprites/{name}/checkpoints.
type Checkpoint struct {
	ID         string    `json:"id"`
	CreateTime time.Time `json:"create_time"`
	Comment    string    `json:"comment,omitempty"`
	History    []string  `json:"history,omitempty"`
	IsAuto     bool      `json:"is_auto,omitempty"`
}

// CreateCheckpoint snapshots the sprite's writable filesystem: POST
// /v1/sprites/{name}/checkpoint, read to the end of its progress stream.
// The stream names the checkpoint only in free text, so this returns no
// id: list the checkpoints and find the comment (the adapter gives each
// a unique one). An "error" event is *adapter.ProviderError; a stream cut
// before its end is an uncertain *adapter.UnavailableError (the
// checkpoint may exist: look for its comment).
func (c *Client) CreateCheckpoint(ctx context.Context, name, comment string) error {
	op := "checkpoint sprite " + name
	body := map[string]string{}
	if comment != "" {
		body["comment"] = comment
	}
	return c.stream(ctx, op, spritePath(name)+"/checkpoint", jsonBody(body))
}

// ListCheckpoints returns the sprite's checkpoints (not the automatic
// ones): GET /v1/sprites/{name}/checkpoints. An answer that is not an
// array is *adapter.UnavailableError, never an empty list.
func (c *Client) ListCheckpoints(ctx context.Context, name string) ([]Checkpoint, error) {
	var raw rawBytes
	op := "list checkpoints of sprite " + name
	if err := c.do(ctx, op, opOther, http.MethodGet, spritePath(name)+"/checkpoints", nil, nil, "", []int{http.StatusOK}, &raw); err != nil {
		return nil, err
	}
	var out []Checkpoint
	if err := json.Unmarshal(raw, &out); err != nil || out == nil && strings.TrimSpace(string(raw)) != "[]" {
		return nil, fail(op, http.StatusOK, unavailable("the answer is not an array of checkpoints"))
	}
	return out, nil
}

// GetCheckpoint returns one checkpoint: GET
// /v1/sprites/{name}/checkpoints/{id}. The API's 404 wraps
// [ErrNoCheckpoint] (kind invalid: the id is unknown, the sprite is not
// said to be absent).
func (c *Client) GetCheckpoint(ctx context.Context, name, id string) (Checkpoint, error) {
	var cp Checkpoint
	err := c.do(ctx, "get checkpoint "+id+" of sprite "+name, opCheckpoint, http.MethodGet,
		spritePath(name)+"/checkpoints/"+url.PathEscape(id), nil, nil, "", []int{http.StatusOK}, &cp)
	return cp, err
}

// RestoreCheckpoint replaces the sprite's writable filesystem with
// checkpoint id: POST /v1/sprites/{name}/checkpoints/{id}/restore, read
// to the end of its progress stream. The restore is asynchronous: the
// sprite restarts (every session ends) and takes execs again a while
// later. An unknown id wraps [ErrNoCheckpoint].
func (c *Client) RestoreCheckpoint(ctx context.Context, name, id string) error {
	op := "restore checkpoint " + id + " of sprite " + name
	return c.stream(ctx, op, spritePath(name)+"/checkpoints/"+url.PathEscape(id)+"/restore", nil)
}

// stream POSTs and reads an NDJSON progress stream to its end.
func (c *Client) stream(ctx context.Context, op, path string, in any) error {
	resp, red, err := c.call.Open(ctx, &httpcall.Request{Op: op, Class: opCheckpoint, Method: http.MethodPost, URL: path,
		JSON: in, Accept: "application/x-ndjson", OK: []int{http.StatusOK}, Uncertain: true})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	// The SDKs read to the end of the stream: a clean end (chunked
	// encoding's last chunk) is the outcome; a cut is a read error.
	err = eachEvent(resp.Body, func(line []byte) (bool, error) {
		var ev struct {
			Type  string `json:"type"`
			Data  string `json:"data"`
			Error string `json:"error"`
		}
		if err := json.Unmarshal(line, &ev); err != nil {
			return true, fail(op, http.StatusOK, &adapter.UnavailableError{Detail: "undecodable progress event", Uncertain: true})
		}
		if ev.Type == "error" {
			msg := red.Clean(ev.Error + ev.Data)
			return true, answered(op, "", msg)
		}
		return false, nil
	})
	var ee eventsError
	if errors.As(err, &ee) {
		return httpcall.TransportError(ctx, provider, op, fmt.Errorf("read progress: %w", ee.err), true, red)
	}
	return err
}

// eventsError is eachEvent's failure to read the stream itself.
type eventsError struct{ err error }

func (e eventsError) Error() string { return e.err.Error() }

// eachEvent calls f with each non-empty line of an NDJSON stream until f
// says stop or returns an error (returned as is); a read failure is an
// eventsError.
func eachEvent(r io.Reader, f func(line []byte) (stop bool, err error)) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		if stop, err := f(line); stop || err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return eventsError{err}
	}
	return nil
}
