package sessions

// Exit watches: the sessions manager records a session's exit itself, once,
// when its journal says the session ended, so no reader has to. Readers
// (GET session, listings, streams, attach) only read: when the record
// lags they answer from the session's own files (Status), never write.

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/journal"
	"github.com/agentrunner/runner/shim/sessiondir"
	"github.com/agentrunner/runner/wire"
)

// exitPoll is how often an exit watch re-checks a session whose journal
// directory it cannot watch (the kernel refused, or the session is still
// starting without one), or whose exit it failed to record.
const exitPoll = 500 * time.Millisecond

// exitWatches are the manager's exit watches, one per session whose shim
// may still run, by session key. A watch starts at spawn (watchExit) and
// at adoption after a restart (Reconcile), and ends once it recorded the
// exit, once the record is gone or another spawn's, or at Close.
//
// mu guards m and closed; every watch goroutine is counted in wg, added
// under mu while not closed, so once close has returned none runs.
type exitWatches struct {
	wg     sync.WaitGroup
	mu     sync.Mutex
	m      map[string]*exitWatch
	closed bool
}

// exitWatch is one session's watch: stop ends it, nudge asks it to look
// now (a reader saw the shim gone), done is closed when it has ended.
type exitWatch struct {
	stop  context.CancelFunc
	nudge chan struct{}
	done  chan struct{}
}

// close ends every watch and waits for them.
func (ew *exitWatches) close() {
	ew.mu.Lock()
	ew.closed = true
	for _, x := range ew.m {
		x.stop()
	}
	ew.mu.Unlock()
	ew.wg.Wait()
}

// get returns the watch of the session key, or nil.
func (ew *exitWatches) get(key string) *exitWatch {
	ew.mu.Lock()
	defer ew.mu.Unlock()
	return ew.m[key]
}

// watchExit starts the exit watch of ss (running, or starting with a
// shim that may come up) unless it has one or the manager is closing.
func (s *Manager) watchExit(ss registry.Session) {
	ew := &s.exits
	ew.mu.Lock()
	if ew.closed || ew.m[ss.Key] != nil {
		ew.mu.Unlock()
		return
	}
	if ew.m == nil {
		ew.m = map[string]*exitWatch{}
	}
	ctx, cancel := context.WithCancel(context.Background())
	x := &exitWatch{stop: cancel, nudge: make(chan struct{}, 1), done: make(chan struct{})}
	ew.m[ss.Key] = x
	ew.wg.Add(1)
	ew.mu.Unlock()
	go func() {
		defer ew.wg.Done()
		defer close(x.done)
		defer cancel()
		s.runExitWatch(ctx, ss, x.nudge)
		ew.mu.Lock()
		delete(ew.m, ss.Key)
		ew.mu.Unlock()
	}()
}

// runExitWatch waits for ss's journal to say the session ended and
// records its exit, until ctx ends. It subscribes before it first looks,
// so an exit after the look always leaves a wake-up behind.
func (s *Manager) runExitWatch(ctx context.Context, ss registry.Session, nudge <-chan struct{}) {
	var dw *journal.DirWatch
	defer func() {
		if dw != nil {
			dw.Close()
		}
	}()
	var tick *time.Ticker
	defer func() {
		if tick != nil {
			tick.Stop()
		}
	}()
	for {
		if dw == nil && ss.State == wire.SessionRunning {
			// A journal not there yet (or gone) is polled for.
			dw, _ = s.watcher.WatchDir(journalDir(s.Dir(ss)))
		}
		done, err := s.settleExit(&ss)
		if done {
			return
		}
		var wake <-chan struct{}
		if dw != nil {
			wake = dw.C()
		}
		var pollC <-chan time.Time
		if err != nil || dw == nil || dw.Lost() {
			if tick == nil {
				tick = time.NewTicker(exitPoll)
			}
			pollC = tick.C
		}
		select {
		case <-ctx.Done():
			return
		case <-wake:
		case <-nudge:
		case <-pollC:
		}
	}
}

// errStarting says a session still starting has not been settled yet.
var errStarting = errors.New("session still starting")

// settleExit looks at ss's shim's files once: done when the exit is
// recorded (exited, or lost with the journal finished as lost) or the
// record is gone or another spawn's; an error asks for a poll.
func (s *Manager) settleExit(ss *registry.Session) (done bool, err error) {
	if ss.State == StateStarting {
		cur, err := s.resolveStarting(s.commits.settled(*ss))
		if err != nil {
			return false, err
		}
		switch cur.State {
		case StateStarting:
			return false, errStarting
		case wire.SessionRunning:
			*ss = cur
		default:
			return true, nil // recorded lost by resolveStarting
		}
	}
	dir := s.Dir(*ss)
	st, err := sessiondir.ReadStatus(dir)
	if err != nil {
		cur, gerr := s.reg.GetSession(ss.Sandbox, ss.ID)
		if errors.Is(gerr, registry.ErrNotFound) || (gerr == nil && (cur.Key != ss.Key || cur.Exit != nil)) {
			return true, nil // deleted, or ended and recorded by another path
		}
		return false, err
	}
	var exit wire.Exit
	switch st.State {
	case sessiondir.StateExited:
		if st.Exit == nil {
			return false, nil
		}
		exit = sessiondir.WireExit(*st.Exit)
	case sessiondir.StateLost:
		e, err := FinishLost(dir, sessiondir.LostDetail)
		if err != nil {
			return false, err
		}
		exit = sessiondir.WireExit(e)
	default:
		return false, nil
	}
	// Recorded already (exec's commit, a terminate) or being recorded:
	// nothing to write.
	if cur := s.commits.settled(*ss); cur.Key == ss.Key && cur.Exit != nil {
		return true, nil
	}
	if _, err := s.recordExit(*ss, exit); err != nil {
		s.log.Warn("record session exit (retried)", "sandbox", ss.Sandbox, "session", ss.ID, "err", err)
		return false, err
	}
	return true, nil
}

// awaitExitRecorded asks ss's exit watch to look now and waits, a bounded
// while, for it to have recorded the exit; then it returns the record as
// it is. For a reader that found the shim gone without an exit record:
// the watch finishes the journal as lost and records it, the reader
// answers what was recorded.
func (s *Manager) awaitExitRecorded(ss registry.Session) registry.Session {
	x := s.exits.get(ss.Key)
	if x != nil {
		select {
		case x.nudge <- struct{}{}:
		default:
		}
		t := time.NewTimer(5 * time.Second)
		defer t.Stop()
		select {
		case <-x.done:
		case <-t.C:
		}
	}
	if cur, err := s.reg.GetSession(ss.Sandbox, ss.ID); err == nil && cur.Key == ss.Key {
		return cur
	}
	return ss
}
