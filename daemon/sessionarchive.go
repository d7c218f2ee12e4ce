package daemon

// Session archives over HTTP (docs/protocol.md, "Session archives"): the
// ended sessions of a sandbox out of one runnerd and into another, beside
// its checkpoint archive, when a parked sandbox moves.

import (
	"net/http"

	"github.com/agentrunner/runner/daemon/sessions"
	"github.com/agentrunner/runner/wire"
)

// handleExportSessions streams the sandbox's ended sessions as a session
// archive. A refusal (a session still running: 409 conflict) comes before
// the first byte, as an ordinary error answer; a failure after it aborts
// the connection, which leaves the receiver a tar stream without its end,
// refused by every importer.
func (s *server) handleExportSessions(w http.ResponseWriter, r *http.Request) {
	aw := &sessionArchiveWriter{w: w}
	err := s.ssn.ExportArchive(r.Context(), r.PathValue("name"), aw)
	switch {
	case err == nil && !aw.started:
		aw.start()
	case err != nil && !aw.started:
		s.writeError(w, r, err)
	case err != nil:
		s.log.Warn("session export cut", "sandbox", r.PathValue("name"), "err", err)
		panic(http.ErrAbortHandler)
	}
}

// sessionArchiveWriter sends the 200 header with the first bytes.
type sessionArchiveWriter struct {
	w       http.ResponseWriter
	started bool
}

func (a *sessionArchiveWriter) start() {
	a.started = true
	a.w.Header().Set("Content-Type", wire.ContentTypeSessionArchive)
	a.w.WriteHeader(http.StatusOK)
}

func (a *sessionArchiveWriter) Write(p []byte) (int, error) {
	if !a.started {
		a.start()
	}
	return a.w.Write(p)
}

// handleImportSessions reads a session archive (the body, at most
// MaxArchiveBody, archiveIdle at most between reads) into the sandbox:
// 201 with the sessions made.
func (s *server) handleImportSessions(w http.ResponseWriter, r *http.Request) {
	body := &idleReader{r: http.MaxBytesReader(w, r.Body, MaxArchiveBody), rc: http.NewResponseController(w)}
	recs, err := s.ssn.ImportArchive(r.Context(), r.PathValue("name"), body)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := wire.SessionImport{Sessions: make([]wire.Session, 0, len(recs))}
	for _, rec := range recs {
		out.Sessions = append(out.Sessions, sessions.ToWireSession(rec))
	}
	s.writeJSON(w, http.StatusCreated, out)
}
