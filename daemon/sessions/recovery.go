package sessions

// Recovery: what runnerd repairs when it starts (reconcile, removeOrphans)
// and what it collects while it runs (the retention janitor).

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/agentrunner/runner/daemon/internal/every"
	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/shim/sessiondir"
	"github.com/agentrunner/runner/wire"
)

// Reconcile runs once at start, before serving: every session the
// registry thinks is running (or was starting when runnerd died) is
// checked against its shim, so an exit that happened while runnerd was
// down is recorded here, by the manager, not by a first reader; each one
// still running (or starting) is adopted with an exit watch
// (exitwatch.go). Then the session directories no record names are
// removed (removeOrphans).
func (s *Manager) Reconcile(ctx context.Context) error {
	all, err := s.reg.AllSessions()
	if err != nil {
		return err
	}
	for _, ss := range all {
		if ss.State == StateStarting {
			// Running once its shim started the command, lost once the
			// shim is provably gone without, starting (and resolved by a
			// later refresh) while it may still come up.
			if ss, err = s.resolveStarting(ss); err != nil {
				s.log.Warn("recover session", "sandbox", ss.Sandbox, "session", ss.ID, "err", err)
				s.watchExit(ss)
				continue
			}
			if ss.State == StateStarting {
				s.watchExit(ss) // it may still come up
			}
		}
		if ss.State != wire.SessionRunning {
			continue
		}
		if _, err := sessiondir.ReadStatus(s.Dir(ss)); errors.Is(err, sessiondir.ErrNoSession) || errors.Is(err, fs.ErrNotExist) {
			// A running record is written only after the shim's files
			// exist; files that are gone at start were lost to a power
			// loss (none is fsynced before the ack; see journal's fsync
			// policy), and the session with them.
			e, ferr := FinishLost(s.Dir(ss), "the session's files were lost (power loss?)")
			if ferr == nil {
				s.recordExit(ss, sessiondir.WireExit(e))
				s.log.Warn("session lost with its files", "sandbox", ss.Sandbox, "session", ss.ID)
				continue
			}
		}
		out, err := s.Refresh(ss)
		if err != nil {
			s.log.Warn("recover session", "sandbox", ss.Sandbox, "session", ss.ID, "err", err)
			s.watchExit(ss) // retried by its watch
			continue
		}
		s.log.Info("session found", "sandbox", ss.Sandbox, "session", ss.ID, "state", out.State)
		if out.State == wire.SessionRunning {
			s.watchExit(out)
		}
	}
	s.removeOrphans(all)
	return nil
}

// removeOrphans runs once at start, before serving, so no spawn can be
// creating a directory meanwhile: it removes every directory under STATE/s
// that no session record in known names (a delete or a destroy removes the
// record first, a failed spawn forgets its record after its directory, and
// a crash in between leaves one that nothing else collects), once its
// shim is provably gone (shimMayLive, its age read from the directory's
// mtime). One whose shim may live is logged and kept: the next start
// tries again.
func (s *Manager) removeOrphans(known []registry.Session) {
	keys := make(map[string]bool, len(known))
	for _, ss := range known {
		keys[ss.Key] = true
	}
	root := filepath.Join(s.cfg.StateDir, "s")
	ents, err := os.ReadDir(root)
	if err != nil {
		s.log.Warn("collect orphan session directories", "err", err)
		return
	}
	for _, e := range ents {
		if keys[e.Name()] || !e.IsDir() {
			continue
		}
		dir := filepath.Join(root, e.Name())
		fi, err := e.Info()
		if err != nil {
			s.log.Warn("orphan session directory kept", "dir", dir, "err", err)
			continue
		}
		if s.shimMayLive(dir, fi.ModTime()) {
			// A warm shim's staging directory (this runnerd's pool has
			// started before this scan) is no session: kept in silence.
			if !strings.HasPrefix(e.Name(), ".warm-") {
				s.log.Warn("orphan session directory kept: its supervisor may still live", "dir", dir)
			}
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			s.log.Warn("remove orphan session directory", "dir", dir, "err", err)
			continue
		}
		s.log.Info("orphan session directory removed", "dir", dir)
	}
}

// Janitor deletes, every cfg.JanitorInterval until ctx ends, the ended
// sessions whose exit is older than cfg.SessionRetention, exactly as
// DELETE does; a session it cannot delete yet (its shim lives) is tried
// again at the next tick.
func (s *Manager) Janitor(ctx context.Context) {
	every.Until(ctx, s.cfg.JanitorInterval, func() bool {
		s.collect(ctx)
		return true
	})
}

// collect is one janitor pass; it stops between sessions once ctx ends.
func (s *Manager) collect(ctx context.Context) {
	all, err := s.reg.AllSessions()
	if err != nil {
		s.log.Warn("session janitor: read registry", "err", err)
		return
	}
	for _, ss := range all {
		if ctx.Err() != nil {
			return
		}
		if ss, err = s.Refresh(ss); err != nil || ss.Exit == nil {
			continue
		}
		ended := ss.Exit.Time
		if ended.IsZero() {
			ended = ss.StartedAt
		}
		if time.Since(ended) < s.cfg.SessionRetention {
			continue
		}
		if err := s.Remove(ctx, ss); err != nil {
			s.log.Debug("session janitor: keep session", "sandbox", ss.Sandbox, "session", ss.ID, "err", err)
		}
	}
}
