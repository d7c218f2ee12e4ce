package sessions

import (
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/agentrunner/runner/daemon/registry"
)

// deferredCommits are the session-record updates runnerd makes after the
// answer that reports them (a session now running, an exit already in the
// journal), so that no answer waits for the registry's fsync. Readers that
// must see what a synchronous commit would have shown wait for the commits
// pending for a session (pendingFor, awaitLanded, settled); the others read
// the truth from the shim and the journal anyway (refresh).
//
// mu guards pending and closed. Invariants:
//
//   - A commit's channel is in pending[sandbox/id] from before commit
//     returns until its registry update has returned (landed or failed),
//     and is closed only after it leaves pending. So a reader that takes
//     pendingFor before a registry read and waits for what it got has seen
//     every commit made before that read.
//   - A commit changes a record only while it is still the same spawn's
//     (same Key): a session deleted and re-created under its id is never
//     touched by its predecessor's commits.
//   - Every commit goroutine is counted in wg, added under mu while not
//     closed. After close a commit runs in its caller; so once close has
//     returned no commit is in flight and the registry may be closed.
//
// The sessions manager owns one (Manager.commits); Close closes it after
// the tracked handlers have ended. Safe for concurrent use.
type deferredCommits struct {
	reg *registry.Registry
	log *slog.Logger
	wg  sync.WaitGroup

	mu      sync.Mutex
	pending map[string][]chan struct{} // by pendingKey; each closed once its commit landed
	closed  bool
}

func newDeferredCommits(reg *registry.Registry, log *slog.Logger) *deferredCommits {
	return &deferredCommits{reg: reg, log: log, pending: map[string][]chan struct{}{}}
}

func pendingKey(sandbox, id string) string { return sandbox + "/" + id }

// commit updates ss's record with change in a goroutine of its own, and
// only if the record is still ss's spawn (same key). what names the update
// in the log line of a failure (the next read settles it from the shim).
func (d *deferredCommits) commit(ss registry.Session, what string, change func(*registry.Session)) {
	k := pendingKey(ss.Sandbox, ss.ID)
	landed := make(chan struct{})
	d.mu.Lock()
	d.pending[k] = append(d.pending[k], landed)
	async := !d.closed
	if async {
		d.wg.Add(1)
	}
	d.mu.Unlock()
	run := func() {
		defer func() {
			d.mu.Lock()
			if rest := slices.DeleteFunc(d.pending[k], func(c chan struct{}) bool { return c == landed }); len(rest) > 0 {
				d.pending[k] = rest
			} else {
				delete(d.pending, k)
			}
			d.mu.Unlock()
			close(landed)
		}()
		_, err := d.reg.UpdateSession(ss.Sandbox, ss.ID, func(rec *registry.Session) error {
			if rec.Key == ss.Key {
				change(rec)
			}
			return nil
		})
		if err != nil && !errors.Is(err, registry.ErrNotFound) {
			d.log.Warn(what+" (the next read settles it from the shim)", "sandbox", ss.Sandbox, "session", ss.ID, "err", err)
		}
	}
	if !async {
		run()
		return
	}
	go func() {
		defer d.wg.Done()
		run()
	}()
}

// close makes later commits run in their caller and waits for those in
// flight.
func (d *deferredCommits) close() {
	d.mu.Lock()
	d.closed = true
	d.mu.Unlock()
	d.wg.Wait()
}

// pendingFor returns the commits pending now for the session. Taken before
// a registry read, it closes the window in which a commit lands between
// that read and the check.
func (d *deferredCommits) pendingFor(sandbox, id string) []chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.pending[pendingKey(sandbox, id)])
}

// settled returns ss's record once the commits pending for it have landed,
// re-read in any case: one may have landed between the caller's read of ss
// and now. For a record still starting, which refresh would otherwise
// resolve from the shim's files.
func (d *deferredCommits) settled(ss registry.Session) registry.Session {
	awaitLanded(d.pendingFor(ss.Sandbox, ss.ID))
	if cur, err := d.reg.GetSession(ss.Sandbox, ss.ID); err == nil && cur.Key == ss.Key {
		return cur
	}
	return ss
}

// awaitLanded waits, a bounded while, for the commits in pend (a stuck
// registry is read as it is: refresh settles from the shim).
func awaitLanded(pend []chan struct{}) {
	if len(pend) == 0 {
		return
	}
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	for _, c := range pend {
		select {
		case <-c:
		case <-t.C:
			return
		}
	}
}
