package daemon

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentrunner/runner/daemon/apierr"
	"github.com/agentrunner/runner/daemon/sandboxes"
	"github.com/agentrunner/runner/daemon/sessions"
	"github.com/agentrunner/runner/wire"
)

// HeaderRequestID is the response header that carries the id runnerd gave
// a request (docs/protocol.md): every log line about the request carries
// the same id as request_id, so an operator finds the lines of one call a
// client reports. runnerd always makes the id itself; a caller's header of
// that name is ignored, so an id in the log is never text a caller chose.
const HeaderRequestID = "X-Request-Id"

// request is what runnerd notes of one request while it is served: the
// middleware (serveLogged) makes it, writeError fills in the refusal, and
// the middleware logs it and observes its latency once the handler returns.
type request struct {
	id    string
	start time.Time

	mu     sync.Mutex // guards the fields below
	code   wire.Code  // set when the answer is an error
	reason string     // the error's detail, redacted (redactDetail)
}

type requestKey struct{}

// requestOf returns the request noted in ctx, or nil (a handler called
// outside serveLogged, as a test may).
func requestOf(ctx context.Context) *request {
	rq, _ := ctx.Value(requestKey{}).(*request)
	return rq
}

// requestID returns the id of the request ctx belongs to, or "".
func requestID(ctx context.Context) string {
	if rq := requestOf(ctx); rq != nil {
		return rq.id
	}
	return ""
}

// refused notes an error answer. A 5xx's detail is runnerd's own account
// of its failure (a registry or cgroup error) and is kept whole; a 4xx's
// names what the caller sent, and is redacted.
func (rq *request) refused(status int, code wire.Code, detail string) {
	if status < 500 {
		detail = redactDetail(detail)
	}
	rq.mu.Lock()
	rq.code, rq.reason = code, detail
	rq.mu.Unlock()
}

// newRequestID is 16 hex digits from crypto/rand: unique enough to find
// one request in a day of logs, short enough to read out.
func newRequestID() string {
	var b [8]byte
	rand.Read(b[:]) // never fails (crypto/rand's documented contract)
	return hex.EncodeToString(b[:])
}

// quoted matches a Go- or JSON-quoted string in an error detail: where a
// detail names a caller's value (an env entry, an argv word, a field) it
// quotes it, and that value may be a secret.
var quoted = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)

// maxReason bounds the reason a log line carries.
const maxReason = 240

// redactDetail is an error detail fit for the log: every quoted value
// replaced by "…" and the whole cut to maxReason bytes. The detail the
// caller gets keeps the values; the log, which other people read, does not.
func redactDetail(detail string) string {
	r := quoted.ReplaceAllString(detail, `"…"`)
	if len(r) > maxReason {
		r = r[:maxReason] + "…"
	}
	return r
}

// serveLogged gives the request its id (a response header and a context
// value), serves it with next, then logs one line for it and observes its
// latency. The line carries the request id, the method, the route (the
// mux pattern, never the raw path), the sandbox and session named in the
// path once they are valid names, the status, the duration, and for an
// error its code and redacted reason. Never the token or a body.
//
// Successful scrapes and health checks are logged at debug (a scraper
// polls them every few seconds), 5xx at warn, everything else at info.
func (s *server) serveLogged(w http.ResponseWriter, r *http.Request, next func(http.ResponseWriter, *http.Request)) {
	rq := &request{id: newRequestID(), start: time.Now()}
	w.Header().Set(HeaderRequestID, rq.id)
	r = r.WithContext(context.WithValue(r.Context(), requestKey{}, rq))
	rec := &recorder{ResponseWriter: w}
	next(rec, r)

	status, first := rec.result()
	if status == 0 { // the handler wrote nothing: net/http answers 200
		status, first = http.StatusOK, time.Now()
	}
	route := s.routeOf(r) // r.Pattern: ServeMux sets it on this r
	s.metrics.observeRequest(route, status, first.Sub(rq.start))

	rq.mu.Lock()
	code, reason := rq.code, rq.reason
	rq.mu.Unlock()
	attrs := []any{"request_id", rq.id, "method", r.Method, "route", route}
	if name := r.PathValue("name"); name != "" && sandboxes.ValidName(name) == nil {
		attrs = append(attrs, "sandbox", name)
	}
	if id := r.PathValue("id"); id != "" && sessions.ValidSessionID(id) == nil {
		attrs = append(attrs, "session", id)
	}
	attrs = append(attrs, "status", status, "duration_ms", strconv.FormatFloat(float64(time.Since(rq.start).Microseconds())/1000, 'f', 3, 64))
	level, msg := slog.LevelInfo, "request"
	switch {
	case status >= 500:
		level, msg = slog.LevelWarn, "request failed"
	case status >= 400:
		msg = "request refused"
	case route == "GET /metrics" || route == "GET /healthz":
		level = slog.LevelDebug
	}
	if code != "" {
		attrs = append(attrs, "code", code, "reason", reason)
	}
	s.log.Log(r.Context(), level, msg, attrs...)
}

// recorder notes the status a handler answered and when its header went
// out (the latency a client sees before the first byte). It passes
// Flush, ReadFrom, Hijack and Unwrap through: streams flush and send
// files, attaches hijack.
type recorder struct {
	http.ResponseWriter
	mu     sync.Mutex // guards status and first
	status int
	first  time.Time
}

func (rw *recorder) note(status int) {
	rw.mu.Lock()
	if rw.status == 0 {
		rw.status, rw.first = status, time.Now()
	}
	rw.mu.Unlock()
}

func (rw *recorder) result() (int, time.Time) {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	return rw.status, rw.first
}

func (rw *recorder) WriteHeader(status int) {
	if status >= 200 || status == http.StatusSwitchingProtocols {
		rw.note(status)
	}
	rw.ResponseWriter.WriteHeader(status)
}

func (rw *recorder) Write(b []byte) (int, error) {
	rw.note(http.StatusOK)
	return rw.ResponseWriter.Write(b)
}

func (rw *recorder) Flush() {
	rw.note(http.StatusOK)
	if f, ok := rw.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// ReadFrom keeps net/http's sendfile path for an ended stream's journal
// files (streams.go): hidden behind the recorder, io.Copy would copy them
// through user space.
func (rw *recorder) ReadFrom(src io.Reader) (int64, error) {
	rw.note(http.StatusOK)
	if rf, ok := rw.ResponseWriter.(io.ReaderFrom); ok {
		return rf.ReadFrom(src)
	}
	return io.Copy(writerOnly{rw.ResponseWriter}, src)
}

// writerOnly hides every method but Write, so io.Copy cannot recurse into
// ReadFrom.
type writerOnly struct{ io.Writer }

// Hijack is an attach's upgrade: coder/websocket writes the 101 itself on
// the hijacked connection, so it is noted here.
func (rw *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	rw.note(http.StatusSwitchingProtocols)
	return http.NewResponseController(rw.ResponseWriter).Hijack()
}

func (rw *recorder) Unwrap() http.ResponseWriter { return rw.ResponseWriter }

// metricsAddr is Config.MetricsListen made explicit: a bare port is on
// loopback, so no scrape port is open to the network unless its host was
// named.
func metricsAddr(addr string) (string, error) {
	if !strings.Contains(addr, ":") {
		addr = ":" + addr
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("config: metrics listen %q: %w", addr, err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return "", fmt.Errorf("config: metrics listen %q: want HOST:PORT or a port", addr)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port), nil
}

// metricsHandler serves the metrics listener: GET /metrics and GET
// /healthz without the token, and nothing else (404 invalid, as the API's
// unknown routes). It is read-only; the series hold sandbox names, never
// a token, a command or output.
func (s *server) metricsHandler() http.Handler {
	m := http.NewServeMux()
	m.HandleFunc("GET /metrics", s.handleMetrics)
	m.HandleFunc("GET /healthz", s.handleHealth)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.serveLogged(w, r, func(w http.ResponseWriter, r *http.Request) {
			if _, pattern := m.Handler(r); pattern == "" {
				s.writeError(w, r, apierr.NoRoute)
				return
			}
			m.ServeHTTP(w, r)
		})
	})
}
