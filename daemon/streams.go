package daemon

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"

	"github.com/agentrunner/runner/journal"
	"github.com/agentrunner/runner/wire"
)

// handleStream serves one stream as plain bytes, ending with trailers that
// say how it ended (docs/protocol.md). A body without the
// Runner-Stream-End trailer was cut.
func (s *server) handleStream(w http.ResponseWriter, r *http.Request) {
	ss, err := s.session(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	stream := r.PathValue("stream")
	if !slices.Contains(streamsOf(ss.Request.TTY), stream) {
		s.writeError(w, r, errInvalid("session %q has no stream %q", ss.ID, stream))
		return
	}
	cursor, err := parseCursor(r, "cursor")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	follow := r.URL.Query().Get("follow")
	if follow != "" && follow != "0" && follow != "1" && follow != "true" && follow != "false" {
		s.writeError(w, r, errInvalid("follow=%q: want 0 or 1", follow))
		return
	}
	following := follow == "1" || follow == "true"
	j, err := s.openJournal(ss)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer j.Close()
	rd, err := s.openReader(j, stream, cursor, following)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer rd.Close()
	done, ok := s.track()
	if !ok {
		s.writeError(w, r, errUnavailable("runnerd is stopping"))
		return
	}
	defer done()

	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Trailer", wire.HeaderStreamEnd+", "+wire.HeaderExit+", "+wire.HeaderError)
	if e, ok, _ := j.Exit(); ok {
		if b, err := json.Marshal(toWireExit(e)); err == nil {
			h.Set(wire.HeaderExit, string(b))
		}
	}
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)

	ctx := r.Context()
	stopCtx, cancel := contextWithStop(ctx, s.stop)
	defer cancel()
	buf := make([]byte, chunkSize)
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
	end, exit, code := "error", (*wire.Exit)(nil), wire.Code("")
	switch {
	case errors.Is(rerr, io.EOF):
		// Liveness first, then the record: the shim may finish between the
		// two looks, so whichever record is found, the body ends "exit"
		// only if it reached that record's length of this stream.
		e, ok, err := j.Exit()
		if err == nil && !ok {
			alive, aerr := j.WriterAlive()
			if aerr == nil && alive {
				end = "more"
				break
			}
			// The writer is gone without an exit record: lost, like a
			// follow reader would find (or the record it wrote just now).
			e, err = finishLost(s.sessionDir(ss), "session supervisor died without an exit record")
		}
		switch {
		case err != nil:
			code = classify(err).code
		case rd.Offset() >= e.Lengths[stream]:
			x := toWireExit(e)
			exit = &x
			if ss.State == wire.SessionRunning {
				s.recordExit(ss, x)
			}
		default:
			end = "more" // the record is known, this body stopped short of it
		}
	case errors.Is(rerr, journal.ErrLost):
		x, err := s.finalExit(ss, j, true) // records the exit too
		if err != nil {
			code = classify(err).code
		} else {
			exit = &x
		}
	default:
		code = classify(rerr).code
	}
	if exit != nil {
		end = "exit"
		if exit.Reason == wire.ExitLost {
			end = "lost"
		}
		b, _ := json.Marshal(exit)
		h.Set(wire.HeaderExit, string(b))
	}
	if code != "" {
		end = "error"
		h.Set(wire.HeaderError, string(code))
	}
	h.Set(wire.HeaderStreamEnd, end)
}
