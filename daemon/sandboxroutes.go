package daemon

// The sandbox routes: create, get, list, delete, suspend, resume,
// network, limits and the checkpoints. Each handler decodes, calls the
// sandboxes manager (package daemon/sandboxes) and encodes its answer.

import (
	"encoding/base64"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/agentrunner/runner/daemon/apierr"
	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/daemon/sandboxes"
	"github.com/agentrunner/runner/wire"
)

func toWireSandbox(sb registry.Sandbox) wire.Sandbox {
	w := wire.Sandbox{
		Name:        sb.Name,
		Incarnation: sb.Incarnation,
		State:       sb.State,
		CreatedAt:   sb.CreatedAt,
		ParkedAt:    sb.ParkedAt,
		Workspace:   sb.Workspace,
		User:        sb.User,
		Network:     sb.Network,
		Isolated:    sb.Isolated || sb.Identity != nil,
		Limits:      sb.Limits,
	}
	if sb.Identity != nil {
		uid, gid := sb.Identity.UID, sb.Identity.GID
		w.UID, w.GID = &uid, &gid
	}
	if sandboxes.InPod(sb) {
		w.Pod, w.Workspace, w.HostWorkspace = true, sandboxes.PodWorkspace, sb.Workspace
	}
	return w
}

func (s *server) handleCreateSandbox(w http.ResponseWriter, r *http.Request) {
	var req wire.CreateSandbox
	if err := decodeJSON(w, r, &req, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, err := s.sbx.Create(r.Context(), req)
	s.answerSandbox(w, r, sb, err, false)
}

func (s *server) handleGetSandbox(w http.ResponseWriter, r *http.Request) {
	sb, err := s.sbx.Get(r.PathValue("name"))
	// With usage: a few file reads per sandbox, which a listing of a
	// thousand would multiply (/metrics has it for every sandbox).
	s.answerSandbox(w, r, sb, err, true)
}

func (s *server) handleListSandboxes(w http.ResponseWriter, r *http.Request) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		s.writeError(w, r, apierr.Invalid("query: %v", err))
		return
	}
	limit := wire.DefaultListLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > wire.MaxListLimit {
			s.writeError(w, r, apierr.Invalid("limit %q: want 1..%d", v, wire.MaxListLimit))
			return
		}
		limit = n
	}
	var after string
	if tok := q.Get("page_token"); tok != "" {
		raw, err := base64.RawURLEncoding.DecodeString(tok)
		if err != nil || sandboxes.ValidName(string(raw)) != nil {
			s.writeError(w, r, apierr.Invalid("malformed page_token"))
			return
		}
		after = string(raw)
	}
	sbs, more, err := s.reg.ListSandboxes(after, limit)
	if err != nil {
		s.writeError(w, r, apierr.Unavailable("read registry: %v", err))
		return
	}
	out := wire.SandboxList{Sandboxes: make([]wire.Sandbox, 0, len(sbs))}
	for _, sb := range sbs {
		out.Sandboxes = append(out.Sandboxes, toWireSandbox(sb))
	}
	if more && len(sbs) > 0 {
		out.NextPageToken = base64.RawURLEncoding.EncodeToString([]byte(sbs[len(sbs)-1].Name))
	}
	s.writeJSON(w, http.StatusOK, out)
}

func (s *server) handleDeleteSandbox(w http.ResponseWriter, r *http.Request) {
	keep, err := keepCheckpoints(r) // checkpoints.go
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeNoContent(w, r, s.sbx.Destroy(r.Context(), r.PathValue("name"), keep))
}

func (s *server) handleSuspend(w http.ResponseWriter, r *http.Request) {
	sb, err := s.sbx.Suspend(r.Context(), r.PathValue("name"))
	s.answerSandbox(w, r, sb, err, false)
}

func (s *server) handleResume(w http.ResponseWriter, r *http.Request) {
	sb, err := s.sbx.Resume(r.Context(), r.PathValue("name"))
	s.answerSandbox(w, r, sb, err, false)
}

func (s *server) handleLimits(w http.ResponseWriter, r *http.Request) {
	var req wire.Limits
	if err := decodeJSON(w, r, &req, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, err := s.sbx.SetLimits(r.Context(), r.PathValue("name"), req)
	// With usage: a few file reads per sandbox, which a listing of a
	// thousand would multiply (/metrics has it for every sandbox).
	s.answerSandbox(w, r, sb, err, true)
}

func (s *server) handleNetwork(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := s.sbx.CanSetNetwork(name); err != nil {
		s.writeError(w, r, err)
		return
	}
	var req wire.Network
	if err := decodeJSON(w, r, &req, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, err := s.sbx.SetNetwork(r.Context(), name, req)
	s.answerSandbox(w, r, sb, err, false)
}

func (s *server) handleCreateCheckpoint(w http.ResponseWriter, r *http.Request) {
	var req wire.CreateCheckpoint
	if err := decodeJSON(w, r, &req, true); err != nil {
		s.writeError(w, r, err)
		return
	}
	if len(req.Comment) > wire.MaxCheckpointComment {
		s.writeError(w, r, apierr.Invalid("comment longer than %d bytes", wire.MaxCheckpointComment))
		return
	}
	c, err := s.sbx.CreateCheckpoint(r.Context(), r.PathValue("name"), req.Comment)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusCreated, c)
}

func (s *server) handleListCheckpoints(w http.ResponseWriter, r *http.Request) {
	out, err := s.sbx.ListCheckpoints(r.Context(), r.PathValue("name"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, out)
}

func (s *server) handleGetCheckpoint(w http.ResponseWriter, r *http.Request) {
	c, err := s.sbx.GetCheckpoint(r.Context(), r.PathValue("name"), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, c)
}

func (s *server) handleDeleteCheckpoint(w http.ResponseWriter, r *http.Request) {
	s.writeNoContent(w, r, s.sbx.DeleteCheckpoint(r.Context(), r.PathValue("name"), r.PathValue("id")))
}

func (s *server) handleRestore(w http.ResponseWriter, r *http.Request) {
	sb, err := s.sbx.RestoreCheckpoint(r.Context(), r.PathValue("name"), r.PathValue("id"))
	s.answerSandbox(w, r, sb, err, false)
}

// MaxArchiveBody bounds the body of POST
// /v1/sandboxes/{name}/checkpoints/import (docs/protocol.md): 64 GiB, far
// above any sandbox disk budget, so a peer that streams forever is cut
// (413 invalid, nothing kept) instead of filling the state directory.
const MaxArchiveBody = 64 << 30

// handleExportCheckpoint streams checkpoint id as an archive. The status
// and Content-Type go out with the first byte (archiveWriter), so a
// refusal before it (unknown sandbox, id or base) is an ordinary error
// answer; a failure after it aborts the connection, which leaves the
// receiver an archive without its end record, refused by every importer.
func (s *server) handleExportCheckpoint(w http.ResponseWriter, r *http.Request) {
	aw := &archiveWriter{w: w}
	_, err := s.sbx.ExportCheckpoint(r.Context(), r.PathValue("name"), r.PathValue("id"),
		r.URL.Query().Get(wire.QueryArchiveBase), aw)
	switch {
	case err == nil && !aw.started:
		aw.start() // cannot happen (an archive has a header), but answer whole
	case err != nil && !aw.started:
		s.writeError(w, r, err)
	case err != nil:
		s.log.Warn("checkpoint export cut", "sandbox", r.PathValue("name"), "checkpoint", r.PathValue("id"), "err", err)
		panic(http.ErrAbortHandler)
	}
}

// archiveWriter sends the 200 header with the first bytes of an archive.
type archiveWriter struct {
	w       http.ResponseWriter
	started bool
}

func (a *archiveWriter) start() {
	a.started = true
	a.w.Header().Set("Content-Type", wire.ContentTypeCheckpointArchive)
	a.w.WriteHeader(http.StatusOK)
}

func (a *archiveWriter) Write(p []byte) (int, error) {
	if !a.started {
		a.start()
	}
	return a.w.Write(p)
}

// archiveIdle bounds how long an import waits for the next bytes of its
// body: the import holds the sandbox's lock, so a client that stops
// sending must not keep the sandbox's spawns and destroy waiting forever.
const archiveIdle = time.Minute

// idleReader sets the connection's read deadline archiveIdle ahead before
// each read.
type idleReader struct {
	r  io.Reader
	rc *http.ResponseController
}

func (i *idleReader) Read(p []byte) (int, error) {
	_ = i.rc.SetReadDeadline(time.Now().Add(archiveIdle)) // unsupported: unbounded, as before
	return i.r.Read(p)
}

// handleImportCheckpoint reads an archive (the body, at most
// MaxArchiveBody, archiveIdle at most between reads) into the sandbox's
// store: 201 with the checkpoint, or 200 when the store held it already,
// identical.
func (s *server) handleImportCheckpoint(w http.ResponseWriter, r *http.Request) {
	body := &idleReader{r: http.MaxBytesReader(w, r.Body, MaxArchiveBody), rc: http.NewResponseController(w)}
	c, created, err := s.sbx.ImportCheckpoint(r.Context(), r.PathValue("name"), body)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	s.writeJSON(w, status, c)
}

// keepCheckpoints reads wire.QueryKeepCheckpoints: whether a destroy
// keeps the sandbox's checkpoints.
func keepCheckpoints(r *http.Request) (bool, error) {
	switch v := r.URL.Query().Get(wire.QueryKeepCheckpoints); v {
	case "", "0", "false":
		return false, nil
	case "1", "true":
		return true, nil
	default:
		return false, apierr.Invalid("%s=%q: want true or false", wire.QueryKeepCheckpoints, v)
	}
}

// answerSandbox answers a sandbox route with sb (its usage too when
// usage), or with err.
func (s *server) answerSandbox(w http.ResponseWriter, r *http.Request, sb registry.Sandbox, err error, usage bool) {
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := toWireSandbox(sb)
	if usage {
		out.Usage = s.sbx.UsageWithDisk(r.Context(), sb)
	}
	s.writeJSON(w, http.StatusOK, out)
}
