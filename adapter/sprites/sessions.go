package sprites

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/hosted/httpcall"
)

// ExecSession is one entry of GET /v1/sprites/{name}/exec (the fields
// sprites-go's ListSessions reads: session.go, types.go Session).
type ExecSession struct {
	ID             string
	Command        string
	Workdir        string
	Created        time.Time
	BytesPerSecond float64
	IsActive       bool
	// LastActivity is zero when the API gave none.
	LastActivity time.Time
	TTY          bool
}

// ListSessions returns the sprite's exec sessions: GET
// /v1/sprites/{name}/exec. An answer without its "sessions" array is
// *adapter.UnavailableError, never an empty list.
func (c *Client) ListSessions(ctx context.Context, name string) ([]ExecSession, error) {
	op := "list exec sessions of sprite " + name
	var body struct {
		Sessions *[]struct {
			ID             json.RawMessage `json:"id"`
			Command        string          `json:"command"`
			Workdir        string          `json:"workdir"`
			Created        string          `json:"created"`
			BytesPerSecond float64         `json:"bytes_per_second"`
			IsActive       bool            `json:"is_active"`
			LastActivity   string          `json:"last_activity"`
			TTY            bool            `json:"tty"`
		} `json:"sessions"`
	}
	if err := c.do(ctx, op, opOther, http.MethodGet, spritePath(name)+"/exec", nil, nil, "", []int{http.StatusOK}, &body); err != nil {
		return nil, err
	}
	if body.Sessions == nil {
		return nil, fail(op, http.StatusOK, unavailable("the answer lacks sessions"))
	}
	out := make([]ExecSession, 0, len(*body.Sessions))
	for _, s := range *body.Sessions {
		e := ExecSession{ID: strings.Trim(string(s.ID), `"`), Command: s.Command, Workdir: s.Workdir,
			BytesPerSecond: s.BytesPerSecond, IsActive: s.IsActive, TTY: s.TTY}
		if t, err := time.Parse(time.RFC3339, s.Created); err == nil {
			e.Created = t
		}
		if t, err := time.Parse(time.RFC3339, s.LastActivity); err == nil {
			e.LastActivity = t
		}
		out = append(out, e)
	}
	return out, nil
}

// KillResult is what POST /v1/sprites/{name}/exec/{id}/kill reported.
type KillResult struct {
	// Signalled is true once the API reported the signal sent.
	Signalled bool
	// TimedOut is true when the command outlived the wait and was killed.
	TimedOut bool
	// Exited is true when the API reported the exit; ExitCode is then set.
	Exited   bool
	ExitCode int
}

// Kill signals exec session id ("TERM", "KILL", ... or "SIGTERM") and waits
// up to wait for its exit, after which the API kills it: POST
// /v1/sprites/{name}/exec/{id}/kill?signal=&timeout=, answered as NDJSON
// progress events. wait 0 only sends the signal (Exited is then usually
// false). A session that already exited (410) gives an error wrapping
// adapter.ErrCommandExited; an unknown one (the API's 404) wraps
// [ErrNoSession]. A stream that ends before the exit while waiting is
// *adapter.UnavailableError with Uncertain set.
func (c *Client) Kill(ctx context.Context, name, id, sig string, wait time.Duration) (KillResult, error) {
	op := "kill exec session " + id + " of sprite " + name
	sig = strings.TrimPrefix(sig, "SIG")
	if !signals[sig] {
		return KillResult{}, fail(op, 0, invalid("unknown signal"))
	}
	if wait < 0 {
		return KillResult{}, fail(op, 0, invalid("negative wait"))
	}
	q := url.Values{}
	q.Set("signal", "SIG"+sig)
	q.Set("timeout", formatWait(wait))
	resp, red, err := c.call.Open(ctx, &httpcall.Request{Op: op, Method: http.MethodPost, URL: spritePath(name) + "/exec/" + url.PathEscape(id) + "/kill",
		Query: q, Accept: "application/x-ndjson", OK: []int{http.StatusOK}, Uncertain: true,
		Fail: func(status int, h http.Header, raw []byte, red httpcall.Redactor) error {
			eb, hasBody := parseErrorBody(raw)
			switch {
			case status == http.StatusGone:
				return fail(op, status, adapter.ErrCommandExited)
			case status == http.StatusNotFound && hasBody:
				return noSession(op, eb, red)
			}
			return apiStatusError(op, opOther, status, h, eb, hasBody, red)
		}})
	if err != nil {
		return KillResult{}, err
	}
	defer resp.Body.Close()
	var r KillResult
	complete := false
	err = eachEvent(resp.Body, func(line []byte) (bool, error) {
		var ev struct {
			Type     string `json:"type"`
			Message  string `json:"message"`
			ExitCode *int   `json:"exit_code"`
		}
		if err := json.Unmarshal(line, &ev); err != nil {
			return true, fail(op, http.StatusOK, &adapter.UnavailableError{Detail: "undecodable kill event", Uncertain: true})
		}
		switch ev.Type {
		case "signal":
			r.Signalled = true
		case "timeout", "killed":
			r.TimedOut = true
		case "error":
			return true, answered(op, "kill: ", red.Clean(ev.Message))
		case "complete":
			if ev.ExitCode != nil {
				r.Exited, r.ExitCode = true, *ev.ExitCode
			}
			complete = true
			return true, nil
		}
		return false, nil
	})
	var ee eventsError
	switch {
	case errors.As(err, &ee):
		return r, httpcall.TransportError(ctx, provider, op, fmt.Errorf("read events: %w", ee.err), true, red)
	case err != nil:
		return r, err
	case complete:
		return r, nil
	}
	if wait > 0 || !r.Signalled {
		return r, fail(op, http.StatusOK, &adapter.UnavailableError{Detail: "the kill stream ended before its completion", Uncertain: true})
	}
	return r, nil
}

// formatWait spells the kill timeout ("0s", "500ms", "10s").
func formatWait(d time.Duration) string {
	if d == 0 {
		return "0s"
	}
	return formatRunAfter(d)
}

// noSession is the API's own 404 to a kill: no such exec session (or no
// such sprite; Get tells them apart).
func noSession(op string, eb apiErrorBody, red httpcall.Redactor) error {
	e := fail(op, http.StatusNotFound, &adapter.ProviderError{Provider: provider, Detail: "HTTP 404"}).WithCause(ErrNoSession)
	e.Code, e.Message, e.OwnBody = red.Clean(eb.Error), red.Clean(eb.Message), true
	return e
}

// answered is an error event of a 200 progress stream: msg is the API's.
func answered(op, what, msg string) error {
	e := fail(op, http.StatusOK, &adapter.ProviderError{Provider: provider, Detail: what + msg})
	e.Message = msg
	return e
}
