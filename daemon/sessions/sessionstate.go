package sessions

// Session state: the manager brings a session's record up to date from its
// shim's own files (Refresh, the exit watches of exitwatch.go, Reconcile);
// a reader answers from those files when the record lags (Status), and
// never writes, so every reader agrees with the shim and the journal
// whatever runnerd missed (a crash, a commit not landed yet).

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentrunner/runner/daemon/apierr"
	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/journal"
	"github.com/agentrunner/runner/shim/sessiondir"
	"github.com/agentrunner/runner/wire"
)

// StateStarting marks a session record written before its shim was
// started, so a crash between the two is found again at the next start.
// It never crosses the wire (it reads as running).
const StateStarting = "starting"

// endedState is the state of a session that ended with exit.
func endedState(exit wire.Exit) string {
	if exit.Reason == wire.ExitLost {
		return wire.SessionLost
	}
	return wire.SessionExited
}

// RecordExitLater records exit, already in the session's journal, in a
// commit of its own, so that no answer waits for the registry's fsync.
// Only a record of the same spawn that has not ended is changed. For the
// manager's own flows: readers never call it (the exit watches record
// exits, exitwatch.go).
func (s *Manager) RecordExitLater(ss registry.Session, exit wire.Exit) {
	state := endedState(exit)
	s.commits.commit(ss, "record session exit", func(rec *registry.Session) {
		if rec.State == wire.SessionRunning || rec.State == StateStarting {
			rec.State, rec.Exit = state, &exit
			s.logEnded(*rec) // sessionstate.go
		}
	})
	s.wakeCollector(ss.Sandbox) // sessions_cap.go; it waits for this commit
}

// Status returns ss as its shim's own files say it is now, for a reader
// (GET session): it never writes the registry. A record that lags an exit
// the journal holds is answered with that exit, the same record the exit
// watch commits; a shim gone without an exit record is settled by the
// exit watch (the journal finished as lost, the exit recorded), which
// Status waits for, a bounded while.
func (s *Manager) Status(ss registry.Session) (registry.Session, error) {
	if ss.State == StateStarting {
		ss = s.commits.settled(ss)
	}
	dir := s.Dir(ss)
	if ss.State == StateStarting {
		st, err := sessiondir.ReadStatus(dir)
		if err != nil {
			return ss, nil // not started yet, as far as its files say
		}
		ss.State, ss.PID = wire.SessionRunning, st.PID
		if !st.StartedAt.IsZero() {
			ss.StartedAt = st.StartedAt.UTC()
		}
	}
	if ss.State != wire.SessionRunning {
		return ss, nil
	}
	st, err := sessiondir.ReadStatus(dir)
	if err != nil {
		return ss, apierr.Unavailable("read session status: %v", err)
	}
	switch st.State {
	case sessiondir.StateExited:
		if st.Exit != nil {
			exit := sessiondir.WireExit(*st.Exit)
			ss.State, ss.Exit = endedState(exit), &exit
		}
	case sessiondir.StateLost:
		ss = s.awaitExitRecorded(ss) // exitwatch.go
	}
	return ss, nil
}

// Refresh brings a running session's record up to date with its shim's
// own status: exited (the exit record), lost (the shim died without one:
// the journal is finished as lost so every reader agrees), or running.
func (s *Manager) Refresh(ss registry.Session) (registry.Session, error) {
	if ss.State == StateStarting {
		ss = s.commits.settled(ss)
	}
	if ss.State == StateStarting {
		var err error
		if ss, err = s.resolveStarting(ss); err != nil || ss.State != wire.SessionRunning {
			return ss, err
		}
	}
	if ss.State != wire.SessionRunning {
		return ss, nil
	}
	dir := s.Dir(ss)
	st, err := sessiondir.ReadStatus(dir)
	if err != nil {
		return ss, apierr.Unavailable("read session status: %v", err)
	}
	var exit wire.Exit
	switch st.State {
	case "exited":
		if st.Exit == nil {
			return ss, nil
		}
		exit = sessiondir.WireExit(*st.Exit)
	case "lost":
		e, err := FinishLost(dir, sessiondir.LostDetail)
		if err != nil {
			return ss, err
		}
		exit = sessiondir.WireExit(e)
	default:
		return ss, nil
	}
	return s.recordExit(ss, exit)
}

// resolveStarting settles a session recorded as starting from its shim's
// own files: running (with the command's pid) once the shim wrote
// started.json; lost, "never started", once its shim is provably gone
// without having started the command; still starting otherwise.
func (s *Manager) resolveStarting(ss registry.Session) (registry.Session, error) {
	dir := s.Dir(ss)
	st, err := sessiondir.ReadStatus(dir)
	if err == nil {
		out, err := s.reg.UpdateSession(ss.Sandbox, ss.ID, func(rec *registry.Session) error {
			if rec.State == StateStarting {
				rec.State, rec.PID = wire.SessionRunning, st.PID
				if !st.StartedAt.IsZero() {
					rec.StartedAt = st.StartedAt.UTC()
				}
			}
			return nil
		})
		if errors.Is(err, registry.ErrNotFound) {
			ss.State, ss.PID = wire.SessionRunning, st.PID
			return ss, nil // destroyed meanwhile
		}
		if err != nil {
			return ss, apierr.Unavailable("record session: %v", err)
		}
		return out, nil
	}
	if s.shimMayLive(dir, ss.StartedAt) {
		// Not started yet, or mid-setup (its files half made): a shim
		// that may still come up leaves the session starting, whatever
		// its files say this instant.
		return ss, nil
	}
	if !errors.Is(err, sessiondir.ErrNoSession) {
		return ss, apierr.Unavailable("read session status: %v", err)
	}
	// Either it never started, or it started and its files went with a
	// power loss before they were durable (the record's "running" commit
	// comes after the answer, so a record can still say starting): the
	// detail says both, never only the first.
	e, err := FinishLost(dir, "the session never started, or its files were lost (power loss?): its supervisor is gone")
	if err != nil {
		return ss, err
	}
	return s.recordExit(ss, sessiondir.WireExit(e))
}

// shimMayLive reports whether a shim of the session directory dir, which
// has not started its command yet, may still be alive: while a spawn
// begun at since may still be starting it, while shim.pid names a live
// process, or while any process has dir's shim.log as its stdout or
// stderr (every shim does from its detach on, before shim.pid). Only
// false is a proof.
func (s *Manager) shimMayLive(dir string, since time.Time) bool {
	if time.Since(since) < s.cfg.ShimStartTimeout+5*time.Second {
		return true
	}
	if b, err := os.ReadFile(filepath.Join(dir, sessiondir.PIDFile)); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
			if err := unix.Kill(pid, 0); err == nil || errors.Is(err, unix.EPERM) {
				return true
			}
		}
	}
	logPath := filepath.Join(dir, sessiondir.LogFile)
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return true
	}
	for _, p := range procs {
		if _, err := strconv.Atoi(p.Name()); err != nil {
			continue
		}
		for _, fd := range []string{"1", "2"} {
			if l, err := os.Readlink(filepath.Join("/proc", p.Name(), "fd", fd)); err == nil && l == logPath {
				return true
			}
		}
	}
	return false
}

// recordExit stores a session's exit record, if the record is still ss's
// spawn (same key).
func (s *Manager) recordExit(ss registry.Session, exit wire.Exit) (registry.Session, error) {
	state := endedState(exit)
	other := false
	out, err := s.reg.UpdateSession(ss.Sandbox, ss.ID, func(rec *registry.Session) error {
		if other = rec.Key != ss.Key; other {
			return nil // deleted and re-created meanwhile: not this session
		}
		if rec.PID == 0 {
			rec.PID = ss.PID // its running commit may not have landed
		}
		ended := rec.Exit == nil
		rec.State = state
		rec.Exit = &exit
		if ended {
			s.logEnded(*rec) // sessionstate.go
		}
		return nil
	})
	if errors.Is(err, registry.ErrNotFound) || (err == nil && other) {
		ss.State, ss.Exit = state, &exit
		return ss, nil // destroyed meanwhile; the answer is still true
	}
	if err != nil {
		if apierr.IsNoSpace(err) {
			return ss, apierr.NoSpace("record exit", err) // diskfull.go
		}
		return ss, apierr.Unavailable("record exit: %v", err)
	}
	s.wakeCollector(ss.Sandbox) // sessions_cap.go
	return out, nil
}

// logEnded logs and counts a session's end, once: each caller calls it
// where the registry record turns from running to ended.
func (s *Manager) logEnded(rec registry.Session) {
	e := rec.Exit
	if e == nil {
		return
	}
	s.metrics.SessionEnded(e)
	s.log.Info("session ended", "sandbox", rec.Sandbox, "session", rec.ID, "reason", e.Reason,
		"code", e.Code, "signal", e.Signal, "terminated", e.Terminated, "oom_killed", e.OOMKilled)
}

var sessionIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

func ValidSessionID(id string) error {
	if !sessionIDPattern.MatchString(id) {
		return apierr.Invalid("session id %q: want 1-64 of [A-Za-z0-9._-], starting with a letter or digit", id)
	}
	return nil
}

// FinalExit returns the exit record of a session whose streams have all
// been read to their end (sessiondir.FinalExit: lost says a reader saw the
// writer gone without an exit record, and the journal is then finished as
// lost, which FinishLost makes idempotent). It writes no registry record:
// the session's exit watch does (exitwatch.go), or exec, which owns its
// session up to its result.
func (s *Manager) FinalExit(ss registry.Session, j *journal.Journal, lost bool) (wire.Exit, error) {
	exit, err := sessiondir.FinalExit(j, s.Dir(ss), lost)
	if err != nil {
		return wire.Exit{}, apierr.Unavailable("%v", err)
	}
	return exit, nil
}

// FinishLost writes the "lost" exit record into a journal whose writer is
// gone without one (sessiondir.FinishLost); its failures are unavailable.
func FinishLost(sessionDir, detail string) (journal.Exit, error) {
	e, err := sessiondir.FinishLost(sessionDir, detail)
	if err != nil {
		return journal.Exit{}, apierr.Unavailable("%v", err)
	}
	return e, nil
}
