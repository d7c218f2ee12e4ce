package daemon

// The checkpoint routes: decode, one call of the sandboxes manager
// (sandboxes/checkpoints.go), encode.

import (
	"net/http"

	"github.com/agentrunner/runner/daemon/apierr"
	"github.com/agentrunner/runner/wire"
)

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
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, toWireSandbox(sb))
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
