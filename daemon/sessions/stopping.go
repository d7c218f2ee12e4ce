package sessions

// Stopping: ending sessions (terminate, the processes that outlive a
// command) and removing ended ones. A stop that cannot be confirmed is
// unavailable "uncertain", never reported done.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/agentrunner/runner/daemon/apierr"
	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/shim/launch"
	"github.com/agentrunner/runner/shim/sessiondir"
	"github.com/agentrunner/runner/wire"
)

// Terminate stops a session (SIGTERM, SIGKILL after grace) and every
// process it started, also those that outlived an ended command, and
// returns its exit record once it is in the journal. An outcome it cannot
// confirm is unavailable "uncertain".
func (s *Manager) Terminate(ctx context.Context, ss registry.Session, grace time.Duration) (registry.Session, error) {
	return s.endSession(ctx, ss, grace, s.recordExit)
}

// endSession is terminate with the exit record stored by record, which
// returns the session as recorded: recordExit for one session, a
// Collector for a stop of many (stopSessions), which stores every exit in
// one registry transaction afterwards.
func (s *Manager) endSession(ctx context.Context, ss registry.Session, grace time.Duration,
	record func(registry.Session, wire.Exit) (registry.Session, error)) (registry.Session, error) {
	ss, err := s.Refresh(ss)
	if err != nil {
		return ss, err
	}
	if ss.State == StateStarting {
		// Its shim may still start the command: never report it stopped.
		return ss, apierr.Uncertain("session %s is still starting; retry", ss.ID)
	}
	if ss.State != wire.SessionRunning {
		if err := s.stopLingering(ctx, ss, grace); err != nil {
			return ss, apierr.Uncertain("%v", err)
		}
		return ss, nil
	}
	uncertain := func(cause error) (registry.Session, error) {
		if again, rerr := s.Refresh(ss); rerr == nil && again.State != wire.SessionRunning {
			return again, nil
		}
		return ss, apierr.Uncertain("%v", cause)
	}
	c, tctx, cancel, err := launch.DialFor(context.WithoutCancel(ctx), s.Dir(ss), launch.Stop(grace))
	defer cancel()
	if err != nil {
		return uncertain(err)
	}
	defer c.Close()
	e, err := c.Terminate(tctx, grace)
	if errors.Is(err, sessiondir.ErrWriteFailed) {
		// The command has ended but its exit record cannot be written
		// (disk full): say so now rather than wait out the deadline. The
		// shim publishes the record once there is space.
		return ss, err
	}
	if err != nil {
		return uncertain(err)
	}
	ss, err = record(ss, sessiondir.WireExit(e))
	if err == nil {
		if lerr := s.stopLingering(ctx, ss, grace); lerr != nil {
			return uncertain(lerr)
		}
	}
	return ss, err
}

// stopParallelism bounds how many sessions a stop of many (destroy,
// suspend) ends at once. Ending one is mostly waiting (for the command to
// exit and the shim to sync its journal), so many overlap well; the bound
// keeps a sandbox of thousands from opening thousands of shim connections
// and goroutines at once, which starved the shims themselves and turned
// load into "uncertain".
const stopParallelism = 64

// stopSessions terminates every session, at most stopParallelism at a
// time: the running ones, and the processes that outlived the command of
// an ended one (terminate). Each session's deadlines start when its turn
// does, so waiting in line never reads as a shim that does not answer.
// The exits are stored in one registry transaction at the end, not one
// fsync per session; each is already in its journal, so a crash before
// that is repaired from the journal (refresh).
func (s *Manager) stopSessions(ctx context.Context, sessions []registry.Session, grace time.Duration) error {
	var mu sync.Mutex // guards exits
	exits := map[string]wire.Exit{}
	collect := func(ss registry.Session, exit wire.Exit) (registry.Session, error) {
		mu.Lock()
		exits[ss.ID] = exit
		mu.Unlock()
		ss.State, ss.Exit = endedState(exit), &exit
		return ss, nil
	}
	var wg sync.WaitGroup
	errs := make([]error, len(sessions))
	next := make(chan int)
	for range min(stopParallelism, len(sessions)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				_, errs[i] = s.endSession(ctx, sessions[i], grace, collect)
			}
		}()
	}
	for i := range sessions {
		next <- i
	}
	close(next)
	wg.Wait()
	if len(exits) > 0 && len(sessions) > 0 {
		ids := make([]string, 0, len(exits))
		for id := range exits {
			ids = append(ids, id)
		}
		keys := map[string]string{}
		for _, ss := range sessions {
			keys[ss.ID] = ss.Key
		}
		err := s.reg.UpdateSessions(sessions[0].Sandbox, ids, func(rec *registry.Session) {
			if rec.Key == keys[rec.ID] { // the same spawn, not a successor under its id
				exit := exits[rec.ID]
				ended := rec.Exit == nil
				rec.State, rec.Exit = endedState(exit), &exit
				if ended {
					s.logEnded(*rec) // sessionstate.go
				}
			}
		})
		if err != nil {
			// Every command has ended (its exit is in its journal); only
			// the registry lags, and any read repairs it.
			if apierr.IsNoSpace(err) {
				return apierr.NoSpace("record exits", err)
			}
			return apierr.Unavailable("record exits: %v", err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return apierr.Uncertain("stop sessions: %v", err)
	}
	return nil
}

// stopLingering stops the processes a session started that outlived its
// command (a shim keeps them, as their subreaper, until they are gone or
// terminated) and confirms that none is left: an error when it cannot.
func (s *Manager) stopLingering(ctx context.Context, ss registry.Session, grace time.Duration) error {
	dir := s.Dir(ss)
	n, err := lingering(ctx, dir)
	if err != nil || n == 0 {
		return err
	}
	c, tctx, cancel, err := launch.DialFor(context.WithoutCancel(ctx), dir, launch.StopTree(grace))
	defer cancel()
	if err != nil {
		return fmt.Errorf("session %s: %w", ss.ID, err)
	}
	defer c.Close()
	if _, err := c.Terminate(tctx, grace); err != nil && !errors.Is(err, sessiondir.ErrLost) {
		return fmt.Errorf("session %s: stop lingering processes: %w", ss.ID, err)
	}
	if n, err = lingering(tctx, dir); err == nil && n != 0 {
		err = fmt.Errorf("session %s: %d process(es) still alive after terminate", ss.ID, n)
	}
	return err
}

// lingering returns how many processes of the session in dir are alive
// besides its command, as its shim counts them; 0 when the shim is gone
// (a shim exits only once none is left).
func lingering(ctx context.Context, dir string) (int, error) {
	if _, err := os.Stat(filepath.Join(dir, sessiondir.SocketFile)); errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	c, ctx, cancel, err := launch.DialFor(ctx, dir, launch.Check)
	defer cancel()
	if errors.Is(err, sessiondir.ErrNoSession) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("ask the shim of %s: %w", filepath.Base(dir), err)
	}
	defer c.Close()
	st, err := c.Status(ctx)
	if err != nil {
		return 0, fmt.Errorf("ask the shim of %s: %w", filepath.Base(dir), err)
	}
	if st.Descendants < 0 {
		return 0, fmt.Errorf("the shim of %s cannot count its processes", filepath.Base(dir))
	}
	return st.Descendants, nil
}

// errSessionLive is returned by Remove's registry check when the
// record changed to a live state under it.
var errSessionLive = errors.New("session is live")

// Remove deletes an ended session: its record, then its directory
// (journal included). A session that runs, is starting, or whose shim
// still lives (processes it started outlived the command) is refused with
// 409 invalid: terminate it first. The record goes first, so a crash in
// between leaves an unreferenced directory (removed at the next start,
// removeOrphans), never a record without files.
func (s *Manager) Remove(ctx context.Context, ss registry.Session) error {
	_, err := s.deleteSession(ctx, ss)
	return err
}

// deleteSession is Remove; deleted reports whether this call
// removed the record (false: it was gone already).
func (s *Manager) deleteSession(ctx context.Context, ss registry.Session) (deleted bool, err error) {
	ss, err = s.Refresh(ss)
	if err != nil {
		return false, err
	}
	if ss.State == wire.SessionRunning || ss.State == StateStarting {
		return false, apierr.ConflictFor(wire.ReasonSessionRunning, "session %s is running; terminate it first", ss.ID)
	}
	dir := s.Dir(ss)
	if err := s.shimGone(ctx, dir, ss.ID); err != nil {
		return false, err
	}
	// deleted: by this call; a concurrent delete (DELETE, the collector)
	// refunds the journal once.
	err = s.reg.DeleteSessionIf(ss.Sandbox, ss.ID, func(cur registry.Session) error {
		if cur.Key != ss.Key || cur.State == wire.SessionRunning || cur.State == StateStarting {
			return errSessionLive
		}
		deleted = true
		return nil
	})
	if errors.Is(err, errSessionLive) {
		return false, apierr.Conflict("session %s changed during the delete; retry", ss.ID)
	}
	if err != nil {
		return false, apierr.RegistryWrite(err) // diskfull.go
	}
	s.bookDrop(ss.Sandbox, ss.ID) // sessions_cap.go
	if deleted {
		s.refundJournal(ss) // journalcap.go: before its files go
	}
	if err := os.RemoveAll(dir); err != nil {
		return deleted, apierr.Unavailable("remove session %s: %v", ss.ID, err)
	}
	s.sbx.ReplenishReserve()
	s.sbx.RemoveSessionCgroup(ctx, ss) // limits.go
	s.log.Info("session deleted", "sandbox", ss.Sandbox, "session", ss.ID)
	return deleted, nil
}

// shimGone returns nil once the shim of the ended session in dir is gone
// (shimMayLive proves it), and 409 invalid while it lives because
// processes the session started still run. A shim that lives with none
// (it is exiting) is waited for briefly.
func (s *Manager) shimGone(ctx context.Context, dir, id string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for {
		if !s.shimMayLive(dir, time.Time{}) {
			return nil
		}
		if n, err := lingering(ctx, dir); err == nil && n != 0 {
			return apierr.ConflictFor(wire.ReasonSessionRunning, "session %s ended but %d process(es) it started still run; terminate it first", id, n)
		}
		select {
		case <-ctx.Done():
			return apierr.ConflictFor(wire.ReasonSessionRunning, "session %s ended but its supervisor still runs; terminate it first", id)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// StopAll terminates every session of sandbox name (see
// stopSessions) and returns them.
func (s *Manager) StopAll(ctx context.Context, name string, grace time.Duration) ([]registry.Session, error) {
	sessions, err := s.reg.ListSessions(name)
	if err != nil {
		return nil, apierr.Unavailable("read registry: %v", err)
	}
	return sessions, s.stopSessions(ctx, sessions, grace)
}
