package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/agentrunner/runner/daemon/apierr"
	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/journal"
	"github.com/agentrunner/runner/shim/launch"
	"github.com/agentrunner/runner/shim/sessiondir"
	"github.com/agentrunner/runner/wire"
)

// This file is the one place that maps errors to HTTP status and wire code.
// Handlers return Go errors; writeError classifies them here. Statuses come
// from wire.ErrorTable (the one error table); the few cases with a more
// specific status than a code's default (409 conflict, 413, 404 no route)
// use one the table lists for that code.

// classify turns any error into an apierr.Error. Absence becomes not_found only
// through errNotFound, which handlers build after the registry answered
// registry.ErrNotFound for the exact thing addressed; a bare
// registry.ErrNotFound reaching here is a bug and is answered unavailable,
// never not_found.
func classify(err error) *apierr.Error {
	var ae *apierr.Error
	if errors.As(err, &ae) {
		return ae
	}
	var mbe *http.MaxBytesError
	var ce *journal.CursorError
	switch {
	case errors.As(err, &ce):
		// A cursor behind the retained data or beyond the end; the code
		// is sessiondir.JournalCode's, the one journal mapping attach frames use.
		c := sessiondir.JournalCode(err)
		return &apierr.Error{Status: c.Status(), Code: c, Detail: ce.Error()}
	case errors.Is(err, journal.ErrUnknownStream):
		return apierr.Invalid("%v", err)
	case errors.Is(err, sessiondir.ErrExited):
		return apierr.CommandExited()
	case errors.Is(err, sessiondir.ErrInvalid):
		return apierr.Invalid("%v", err)
	case errors.Is(err, sessiondir.ErrWriteFailed) && apierr.IsNoSpace(err):
		return apierr.NoSpace("session", err) // diskfull.go
	case errors.Is(err, sessiondir.ErrWriteFailed):
		return apierr.WriteFailed("%v", err)
	case errors.Is(err, launch.ErrFailed):
		return apierr.Provider("%v", err)
	case errors.As(err, &mbe):
		return apierr.TooLarge(mbe.Limit)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return apierr.Unavailable("%v", err)
	case errors.Is(err, registry.ErrNotFound):
		return apierr.Unavailable("internal: unscoped absence: %v", err)
	}
	return apierr.Unavailable("%v", err)
}

// writeError writes err as runnerd's error response and counts it.
func (s *server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	ae := classify(err)
	s.metrics.countError(ae.Code)
	if rq := requestOf(r.Context()); rq != nil {
		rq.refused(ae.Status, ae.Code, ae.Detail) // serveLogged logs it (requests.go)
	} else {
		s.logUnserved(r, ae)
	}
	h := w.Header()
	h.Set(wire.HeaderError, string(ae.Code))
	h.Set("Content-Type", "application/json")
	if ae.RetryAfterMS > 0 {
		h.Set("Retry-After", strconv.FormatInt((ae.RetryAfterMS+999)/1000, 10))
	}
	body, _ := json.Marshal(wire.ErrorBody{Error: wire.Error{Code: ae.Code, Detail: ae.Detail, RetryAfterMS: ae.RetryAfterMS, Uncertain: ae.Uncertain, ExecError: ae.ExecError, Reason: ae.Reason}})
	body = append(body, '\n')
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(ae.Status)
	w.Write(body)
}

// logUnserved logs an error answered outside serveLogged (net/http's own
// answers reshaped by shapedConn).
func (s *server) logUnserved(r *http.Request, ae *apierr.Error) {
	switch {
	case ae.Status >= 500:
		s.log.Warn("request failed", "method", r.Method, "path", r.URL.Path, "code", ae.Code, "err", ae.Detail)
	case ae.Code == wire.CodeInvalid || ae.Code == wire.CodeDenied:
		// A refused request: the route's template, never the path's
		// values, the token, the body or the detail (which may quote
		// the body, an env entry say).
		s.log.Info("request refused", "method", r.Method, "route", s.routeOf(r), "status", ae.Status, "code", ae.Code)
	}
}

// routeOf is the mux pattern r matches ("POST /v1/sandboxes/{name}/exec"),
// or "unknown".
func (s *server) routeOf(r *http.Request) string {
	if r.Pattern != "" {
		return r.Pattern
	}
	if s.mux != nil {
		if _, p := s.mux.Handler(r); p != "" {
			return p
		}
	}
	return "unknown"
}

// net/http answers a few requests itself, before any handler runs: a
// request line or header it cannot parse (400), a header block larger
// than the server's limit (431), a transfer encoding it does not support
// (501). It writes those straight to the connection as plain text, in one
// Write, with exactly these headers and no Date. Nothing else runnerd
// sends has that shape (every handler response carries a Date), so the
// connection wrapper below recognizes such a write and sends the
// documented error shape instead (Runner-Error header, JSON body, code
// invalid), keeping net/http's status except 501, which is 400 here: the
// request, not the host, is at fault.
const netHTTPErrorHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

// shapedListener wraps every accepted connection in a shapedConn.
type shapedListener struct {
	net.Listener
	s *server
}

func (l shapedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &shapedConn{Conn: c, s: l.s}, nil
}

// shapedConn rewrites net/http's own plain-text error answers (see
// netHTTPErrorHeaders). Only the first write after net/http began reading
// a request's header (it sets a read deadline in the future then: the
// server has ReadHeaderTimeout) is looked at: net/http's own answer is
// that write, while a handler's response starts with its status line and
// a Date header. Every later write (a response body, whose bytes a
// command may choose, or a hijacked WebSocket's frames) passes untouched,
// so no output can be made to read as an error. After a 101 the
// connection is no longer HTTP and is never armed again.
type shapedConn struct {
	net.Conn
	s        *server
	armed    atomic.Bool // the next write may be net/http's own error answer
	upgraded atomic.Bool // a 101 was written: a WebSocket now
}

func (c *shapedConn) SetReadDeadline(t time.Time) error {
	// net/http's readRequest sets now+ReadHeaderTimeout; aborting a
	// background read sets a time long past, which must not arm.
	if t.After(time.Now()) && !c.upgraded.Load() {
		c.armed.Store(true)
	}
	return c.Conn.SetReadDeadline(t)
}

func (c *shapedConn) SetDeadline(t time.Time) error {
	c.armed.Store(false)
	return c.Conn.SetDeadline(t)
}

func (c *shapedConn) Write(p []byte) (int, error) {
	if !c.armed.Swap(false) {
		return c.Conn.Write(p)
	}
	if bytes.HasPrefix(p, []byte("HTTP/1.1 101 ")) {
		c.upgraded.Store(true)
	}
	if out, ok := c.s.shapeNetHTTPError(p); ok {
		if _, err := c.Conn.Write(out); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	return c.Conn.Write(p)
}

// shapeNetHTTPError returns the documented form of p when p is one of
// net/http's own error answers ("HTTP/1.1 431 Request Header Fields Too
// Large" + netHTTPErrorHeaders + text).
func (s *server) shapeNetHTTPError(p []byte) ([]byte, bool) {
	rest, ok := bytes.CutPrefix(p, []byte("HTTP/1.1 "))
	if !ok {
		return nil, false
	}
	statusLine, text, ok := bytes.Cut(rest, []byte(netHTTPErrorHeaders))
	if !ok || bytes.ContainsAny(statusLine, "\r\n") || len(statusLine) < 4 {
		return nil, false
	}
	status, err := strconv.Atoi(string(statusLine[:3]))
	if err != nil || status < 400 {
		return nil, false
	}
	if status == http.StatusNotImplemented {
		status = http.StatusBadRequest
	}
	// The text repeats the status line ("400 Bad Request: missing
	// required Host header"); the detail is what follows the code.
	detail := strings.TrimPrefix(string(text), string(statusLine[:4]))
	s.metrics.countError(wire.CodeInvalid)
	s.log.Info("request refused", "method", "unknown", "route", "unknown", "status", status, "code", wire.CodeInvalid)
	body, _ := json.Marshal(wire.ErrorBody{Error: wire.Error{Code: wire.CodeInvalid, Detail: detail}})
	body = append(body, '\n')
	var b bytes.Buffer
	fmt.Fprintf(&b, "HTTP/1.1 %d %s\r\n%s: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n",
		status, http.StatusText(status), wire.HeaderError, wire.CodeInvalid, len(body))
	b.Write(body)
	return b.Bytes(), true
}

// ReadFrom keeps the wrapped connection's sendfile/splice path: net/http
// sends an ended stream's body (a file) through the connection's
// io.ReaderFrom, which a plain wrapper would hide. Handler bodies are
// never net/http's own error answers, so nothing is shaped here.
func (c *shapedConn) ReadFrom(r io.Reader) (int64, error) {
	c.armed.Store(false)
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{c.Conn}, r)
}

// CloseWrite keeps the half-close net/http does after its own error
// answers (so the client reads the answer before a reset).
func (c *shapedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
