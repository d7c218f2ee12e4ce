package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/agentrunner/runner/daemon/apierr"
	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/daemon/sessions"
	"github.com/agentrunner/runner/journal"
	"github.com/agentrunner/runner/shim/sessiondir"
	"github.com/agentrunner/runner/wire"
)

// handleStream serves one stream as plain bytes (docs/protocol.md). A
// session that had ended when the request arrived gets the ended form
// (serveEnded): a Content-Length body and how it ends in the headers. A
// running one gets a chunked body ending with trailers that say how it
// ended; a body without the Runner-Stream-End trailer was cut.
func (s *server) handleStream(w http.ResponseWriter, r *http.Request) {
	if s.refuseWithoutDescriptors(w, r) { // descriptors.go
		return
	}
	ss, err := s.session(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	stream, cursor, following, err := s.streamRequest(w, r, ss)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	j, err := s.ssn.OpenJournal(ss)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer j.Close()
	rd, err := s.ssn.OpenReader(j, stream, cursor, following)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer rd.Close()
	done, ok := s.life.Track()
	if !ok {
		s.writeError(w, r, apierr.Unavailable("runnerd is stopping"))
		return
	}
	defer done()
	e, ended, err := j.Exit()
	ended = ended && err == nil
	if ended && s.serveEnded(w, r, ss, j, rd, stream, e) {
		return
	}
	s.serveChunked(w, r, ss, j, rd, stream, e, ended)
}

// streamRequest reads a stream request: the stream (one ss has), the
// cursor to start at (by byte or by time) and whether to follow. The
// body's first offset is set in its header at once, so a reader that
// asked by time can keep a byte cursor (an error answer carries it too,
// meaning nothing).
func (s *server) streamRequest(w http.ResponseWriter, r *http.Request, ss registry.Session) (stream string, cursor int64, following bool, err error) {
	stream = r.PathValue("stream")
	if !slices.Contains(sessions.StreamsOf(ss.Request.TTY), stream) {
		return "", 0, false, apierr.Invalid("session %q has no stream %q", ss.ID, stream)
	}
	sr, err := s.newSinceResolver(r, ss)
	if err != nil {
		return "", 0, false, err
	}
	cursor, err = sr.cursor(r.Context(), r, stream, "cursor")
	sr.Close()
	if err != nil {
		return "", 0, false, err
	}
	w.Header().Set(wire.HeaderStreamStart, strconv.FormatInt(cursor, 10))
	follow := r.URL.Query().Get("follow")
	if follow != "" && follow != "0" && follow != "1" && follow != "true" && follow != "false" {
		return "", 0, false, apierr.Invalid("follow=%q: want 0 or 1", follow)
	}
	return stream, cursor, follow == "1" || follow == "true", nil
}

// serveChunked serves a stream from rd as a chunked body (following it
// while its session runs) and ends it with the trailers that say how it
// ended; e is the exit record when ended.
func (s *server) serveChunked(w http.ResponseWriter, r *http.Request, ss registry.Session, j *journal.Journal, rd *journal.Reader, stream string, e journal.Exit, ended bool) {
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Trailer", wire.HeaderStreamEnd+", "+wire.HeaderExit+", "+wire.HeaderError)
	if ended {
		if b, err := json.Marshal(sessiondir.WireExit(e)); err == nil {
			h.Set(wire.HeaderExit, string(b))
		}
	}
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)

	ctx := r.Context()
	stopCtx, cancel := s.life.UntilStop(ctx)
	defer cancel()
	buf := make([]byte, sessions.ChunkSize)
	var rerr error
	for {
		var n int
		n, rerr = rd.ReadContext(stopCtx, buf)
		if n > 0 {
			if _, err := w.Write(buf[:n]); err != nil {
				return
			}
			if flusher != nil {
				flusher.Flush()
			}
		}
		if rerr != nil {
			break
		}
	}
	if ctx.Err() != nil || stopCtx.Err() != nil {
		// Cut the connection so the client cannot take the body as whole.
		panic(http.ErrAbortHandler)
	}
	end, exit, code := s.chunkedEnd(ss, j, rd, stream, rerr)
	if exit != nil {
		end = streamEnd(*exit)
		b, _ := json.Marshal(exit)
		h.Set(wire.HeaderExit, string(b))
	}
	if code != "" {
		end = "error"
		h.Set(wire.HeaderError, string(code))
	}
	h.Set(wire.HeaderStreamEnd, end)
}

// chunkedEnd says how a chunked body whose reader stopped with rerr ends:
// "more" (the session runs on, or the body stopped short of its exit
// record), the exit, or an error code.
func (s *server) chunkedEnd(ss registry.Session, j *journal.Journal, rd *journal.Reader, stream string, rerr error) (end string, exit *wire.Exit, code wire.Code) {
	end = "error"
	switch {
	case errors.Is(rerr, io.EOF):
		// Liveness first, then the record: the shim may finish between the
		// two looks, so whichever record is found, the body ends "exit"
		// only if it reached that record's length of this stream.
		e, ok, err := j.Exit()
		if err == nil && !ok {
			alive, aerr := j.WriterAlive()
			if aerr == nil && alive {
				return "more", nil, ""
			}
			// The writer is gone without an exit record: lost, like a
			// follow reader would find (or the record it wrote just now).
			e, err = sessions.FinishLost(s.ssn.Dir(ss), sessiondir.LostDetail)
		}
		switch {
		case err != nil:
			code = classify(err).Code
		case rd.Offset() >= e.Lengths[stream]:
			x := sessiondir.WireExit(e)
			exit = &x // the session's exit watch records it, never a reader
		default:
			end = "more" // the record is known, this body stopped short of it
		}
	case errors.Is(rerr, journal.ErrLost):
		x, err := s.ssn.FinalExit(ss, j, true)
		if err != nil {
			code = classify(err).Code
		} else {
			exit = &x
		}
	default:
		code = classify(rerr).Code
	}
	return end, exit, code
}

// streamEnd is the Runner-Stream-End of a body that reached exit.
func streamEnd(exit wire.Exit) string {
	if exit.Reason == wire.ExitLost {
		return "lost"
	}
	return "exit"
}

// endedSlice bounds one SendTo of serveEnded, so a stopping runnerd cuts a
// long replay within one slice instead of after the whole stream.
const endedSlice = 16 << 20

// serveEnded serves the rest of a stream whose session had ended (its
// exit record present) when the request arrived: the final length is
// known, so the body has a Content-Length and how it ends goes in the
// headers. Reader.SendTo hands the segment files to the ResponseWriter as
// file ranges, and net/http's ReadFrom passes them to the TCP connection,
// which sends them with sendfile(2): a finished replay costs no copy
// through user space (docs/benchmarks.md). That holds only while nothing
// wraps the ResponseWriter without passing ReadFrom through, and only with
// a Content-Length (net/http copies a chunked body through a buffer).
//
// It returns false, having written nothing, when the exit record has no
// length for stream; a journal whose files miss bytes up to the final
// length is answered unavailable.
func (s *server) serveEnded(w http.ResponseWriter, r *http.Request, ss registry.Session, j *journal.Journal, rd *journal.Reader, stream string, e journal.Exit) bool {
	final, ok := e.Lengths[stream]
	if !ok {
		return false // a record without this stream: the chunked form reports it
	}
	if rd.Offset() > final {
		return false
	}
	// Checked before any header: a journal missing bytes of an ended
	// stream gets an answer, not a body cut at the hole that a client
	// would resume into the same hole forever.
	if err := j.Complete(stream, rd.Offset(), final); err != nil {
		s.log.Warn("stream replay refused: journal", "session", ss.ID, "stream", stream, "err", err)
		s.writeError(w, r, apierr.Unavailable("the journal of session %s is missing bytes of its ended stream %s: %v", ss.ID, stream, err))
		return true
	}
	x := sessiondir.WireExit(e)
	exit, err := json.Marshal(x)
	if err != nil {
		return false
	}
	how := streamEnd(x)
	n := final - rd.Offset()
	h := w.Header()
	// A set Content-Type keeps net/http from sniffing a type from the body.
	// It still writes the first 512 bytes (its sniffing window) itself, with
	// the headers, and hands the connection only the rest.
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Length", strconv.FormatInt(n, 10))
	h.Set(wire.HeaderStreamEnd, how)
	h.Set(wire.HeaderExit, string(exit))
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return true
	}
	ctx, cancel := s.life.UntilStop(r.Context())
	defer cancel()
	// A slice can take long to a slow client, and sendfile does not look
	// at ctx: a stopping runnerd (or a client gone) cuts the write at once
	// through its deadline, so Shutdown is not held for a slice.
	rc := http.NewResponseController(w)
	defer context.AfterFunc(ctx, func() { rc.SetWriteDeadline(time.Now()) })()
	for sent := int64(0); sent < n; {
		if ctx.Err() != nil {
			// Cut the connection: the client sees a body shorter than its
			// Content-Length, a transport failure, never the end.
			panic(http.ErrAbortHandler)
		}
		k, err := rd.SendTo(ctx, w, min(n-sent, endedSlice))
		sent += k
		if err != nil {
			// A client that goes away is routine; the journal failing
			// under a finished stream is not.
			if errors.Is(err, journal.ErrCorrupt) || errors.Is(err, journal.ErrTruncated) || errors.Is(err, io.ErrUnexpectedEOF) {
				s.log.Warn("stream replay cut: journal", "session", ss.ID, "stream", stream, "at", rd.Offset(), "err", err)
			}
			panic(http.ErrAbortHandler)
		}
	}
	return true
}

// sinceResolver turns the request's since parameter (wire.QuerySince)
// into a cursor per stream, asking the session's shim
// (sessions.OffsetResolver: the live writer's marks while it runs, the
// journal's index after), so a reattach can skip history by time instead
// of replaying it all. One shim connection serves every stream of the
// request; Close releases it.
type sinceResolver struct {
	since time.Time
	set   bool
	off   *sessions.OffsetResolver
}

// newSinceResolver parses since; malformed is 400 invalid.
func (s *server) newSinceResolver(r *http.Request, ss registry.Session) (*sinceResolver, error) {
	sr := &sinceResolver{off: s.ssn.Offsets(ss)}
	v := r.URL.Query().Get(wire.QuerySince)
	if v == "" {
		return sr, nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return nil, apierr.Invalid("%s=%q: want an RFC 3339 time: %v", wire.QuerySince, v, err)
	}
	sr.since, sr.set = t, true
	return sr, nil
}

// cursor returns the cursor of stream: the byte offset in query key, or
// the first offset written at or after since. Both at once is 400 invalid.
func (sr *sinceResolver) cursor(ctx context.Context, r *http.Request, stream, key string) (int64, error) {
	cursor, err := parseCursor(r, key)
	if err != nil || !sr.set {
		return cursor, err
	}
	if r.URL.Query().Has(key) {
		return 0, apierr.Invalid("%s and %s: give a cursor or a time, not both", key, wire.QuerySince)
	}
	return sr.off.OffsetAt(ctx, stream, sr.since)
}

// Close releases the shim connection, if one was made.
func (sr *sinceResolver) Close() { sr.off.Close() }

// handleMarks serves a stream's offset-time marks (wire.Marks), so a client
// can say when a byte was written to the journal's granularity, without
// runnerd guessing a time it did not record: the shim answers from its
// live writer while the command runs and from the journal's index after.
func (s *server) handleMarks(w http.ResponseWriter, r *http.Request) {
	ss, err := s.session(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	stream := r.URL.Query().Get("stream")
	if !slices.Contains(sessions.StreamsOf(ss.Request.TTY), stream) {
		s.writeError(w, r, apierr.Invalid("session %q has no stream %q", ss.ID, stream))
		return
	}
	from, err := parseCursor(r, wire.QueryFrom)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	m, err := s.ssn.Marks(r.Context(), ss, stream, from)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, m)
}

// parseCursor reads a byte-offset cursor from the query; absent is 0.
func parseCursor(r *http.Request, key string) (int64, error) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return 0, apierr.Invalid("query: %v", err)
	}
	v := q.Get(key)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, apierr.Invalid("cursor %s=%q: want a non-negative byte offset", key, v)
	}
	return n, nil
}
