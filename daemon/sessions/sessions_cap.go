package sessions

// Session bounds per sandbox (#34 finding 6). A sandbox's sessions cost
// two different things, so there are two bounds:
//
//   - A session whose shim may live (its command runs, or processes it
//     started outlived the command) costs the shim: 2-4 MiB charged to
//     runnerd's unit, not to the sandbox (the shim stays outside the
//     sandbox's cgroup so that it outlives its command's OOM kill and
//     reports it). Config.MaxSandboxSessions bounds these: one more is
//     409 invalid, detail wire.DetailSessionCap, and nothing starts.
//   - An ended session costs its record, its directory and its journal
//     (the journal's bytes are bounded apart, by
//     Config.SandboxJournalBytes). Config.MaxSandboxEndedSessions bounds
//     these, and is never a wall: past it the oldest ended sessions of the
//     sandbox are deleted (collected) exactly as DELETE deletes one, the
//     way Kubernetes collects terminated pods past a threshold. An agent
//     whose sandbox runs thousands of execs over weeks keeps working; a
//     command that floods sessions costs at most the two bounds.
//
// The counts come from the sandbox's book (sessionBook): per session,
// whether its exit is recorded and whether its shim is proven gone, kept
// in memory, built from the registry the first time runnerd needs a
// sandbox's counts, and brought up to date (prune) from cheap reads: the
// record of a session whose exit is not known yet, the pid file of a shim
// not yet proven gone. A settled session (ended, shim gone) is never read
// again, so a spawn reads only what may have changed: its cost grows with
// the sessions that run, not with those kept. The book only ever errs on
// the full side: an entry is dropped only when the registry has no
// record, and a shim counts as live until its pid file names a dead
// process or its control socket is gone.
//
// The running count is checked under the sandbox's lock, which every spawn
// holds from before this check to after its entry is added, so two spawns
// of one sandbox cannot both pass one free place. A re-create of an
// existing id (spawn is idempotent) is never refused.
//
// Collection runs in one goroutine (Collector, started by Run), woken for
// a sandbox when a spawn finds more ended sessions than the bound or when
// a session's exit is recorded; it deletes through Remove, so it
// never deletes a session that runs, that starts, whose shim lives, or
// whose exit is not in its journal, and it subtracts the journal's bytes
// from the sandbox's budget as DELETE does. Should the collector fall
// behind a flood, a spawn that finds twice the bound collects itself,
// before its command starts: the bound is hard.

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentrunner/runner/daemon/apierr"
	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/shim/sessiondir"
	"github.com/agentrunner/runner/wire"
)

// collectRetry is how soon the collector looks again at a sandbox with an
// ended session whose shim still lived (it exits just after the exit is
// recorded, unless processes linger), and collectRetries how many times
// per session before it waits for the next wake-up.
const (
	collectRetry   = 100 * time.Millisecond
	collectRetries = 50
)

// sessionBook is what runnerd knows of each sandbox's sessions for their
// bounds, and the collector's queue. mu guards every field; no I/O is done
// under it.
type sessionBook struct {
	collecting sync.Mutex // held by a collection pass (collectEnded)

	mu      sync.Mutex
	boxes   map[string]map[string]*bookEntry // by sandbox, then session id; a sandbox absent is not read yet
	pending map[string]bool                  // sandboxes the collector is to look at
	wake    chan struct{}                    // capacity 1: pending has names
}

// bookEntry is one session in its sandbox's book. exited and gone only
// ever turn true.
type bookEntry struct {
	key     string    // its directory's name (registry.Session.Key)
	created time.Time // registry.Session.CreatedAt: the listing order, the collection order
	exited  bool      // its record holds its exit
	gone    bool      // its shim is proven gone
	tries   int       // collector passes that found it ended with its shim alive
}

func newSessionBook() sessionBook {
	return sessionBook{boxes: map[string]map[string]*bookEntry{}, pending: map[string]bool{}, wake: make(chan struct{}, 1)}
}

// bookOf makes sure sandbox name's book is built, from the registry when
// it is not yet.
func (s *Manager) bookOf(name string) error {
	s.book.mu.Lock()
	_, ok := s.book.boxes[name]
	s.book.mu.Unlock()
	if ok {
		return nil
	}
	sessions, err := s.reg.ListSessions(name)
	if err != nil {
		return err
	}
	m := make(map[string]*bookEntry, len(sessions))
	for _, ss := range sessions {
		e := &bookEntry{key: ss.Key, created: ss.CreatedAt, exited: ss.Exit != nil}
		e.gone = e.exited && shimExited(s.Dir(ss))
		m[ss.ID] = e
	}
	s.book.mu.Lock()
	defer s.book.mu.Unlock()
	if _, ok := s.book.boxes[name]; !ok { // another reader built it meanwhile: that one stays
		s.book.boxes[name] = m
	}
	return nil
}

// bookAdd enters a session whose record spawn has just committed.
func (s *Manager) bookAdd(ss registry.Session) {
	s.book.mu.Lock()
	defer s.book.mu.Unlock()
	if m := s.book.boxes[ss.Sandbox]; m != nil {
		m[ss.ID] = &bookEntry{key: ss.Key, created: ss.CreatedAt}
	}
}

// bookDrop forgets a session whose record is gone.
func (s *Manager) bookDrop(sandbox, id string) {
	s.book.mu.Lock()
	defer s.book.mu.Unlock()
	if m := s.book.boxes[sandbox]; m != nil {
		delete(m, id)
	}
}

// bookForget forgets a destroyed sandbox: a new one of its name is read
// from the registry again.
func (s *Manager) bookForget(name string) {
	s.book.mu.Lock()
	defer s.book.mu.Unlock()
	delete(s.book.boxes, name)
}

// prune brings sandbox name's book up to date for what may have changed:
// each session whose exit is not known yet (its record) or whose shim is
// not proven gone (its pid file). settle (the collector's) also waits for
// the exit commits pending (commits.go) before reading a record, and
// settles from the shim a session whose shim is gone while its record
// still says running (refresh: lost); the spawn path does neither, so it
// never waits for an fsync.
func (s *Manager) prune(name string, settle bool) {
	type look struct {
		id       string
		key      string
		exited   bool
		gone     bool
		notFound bool
	}
	s.book.mu.Lock()
	var looks []look
	for id, e := range s.book.boxes[name] {
		if !e.exited || !e.gone {
			looks = append(looks, look{id: id, key: e.key, exited: e.exited, gone: e.gone})
		}
	}
	s.book.mu.Unlock()
	for i := range looks {
		l := &looks[i]
		dir := s.Dir(registry.Session{Key: l.key})
		if !l.gone {
			l.gone = shimExited(dir)
		}
		if l.exited {
			continue
		}
		if settle {
			awaitLanded(s.commits.pendingFor(name, l.id))
		}
		ss, err := s.reg.GetSession(name, l.id)
		switch {
		case errors.Is(err, registry.ErrNotFound):
			l.notFound = true
			continue
		case err != nil || ss.Key != l.key:
			continue // read again next time
		}
		if ss.Exit == nil && settle && l.gone {
			ss, _ = s.Refresh(ss) // its shim died without telling: lost
		}
		l.exited = ss.Exit != nil
	}
	s.book.mu.Lock()
	defer s.book.mu.Unlock()
	m := s.book.boxes[name]
	for _, l := range looks {
		e := m[l.id]
		if e == nil || e.key != l.key {
			continue
		}
		if l.notFound {
			delete(m, l.id)
			continue
		}
		e.exited = e.exited || l.exited
		e.gone = e.gone || l.gone
	}
}

// bookCounts returns sandbox name's sessions whose shim may live and its
// ended ones.
func (s *Manager) bookCounts(name string) (live, ended int) {
	s.book.mu.Lock()
	defer s.book.mu.Unlock()
	for _, e := range s.book.boxes[name] {
		if !e.gone {
			live++
		}
		if e.exited {
			ended++
		}
	}
	return live, ended
}

// shimExited reports whether the shim of the session in dir is proven
// gone: its pid file (written once it runs, kept after it exits) names a
// process that is dead, or its control socket (made before the pid file,
// removed when it exits) is gone. Anything else, a shim not started yet
// included, is not a proof.
func shimExited(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, sessiondir.PIDFile))
	if err != nil {
		return false
	}
	if _, err := os.Lstat(filepath.Join(dir, sessiondir.SocketFile)); errors.Is(err, os.ErrNotExist) {
		return true
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return err == nil && pid > 0 && errors.Is(unix.Kill(pid, 0), unix.ESRCH)
}

// sessionCap is spawn's check of sandbox name's bounds, for a create of
// session id; the caller holds name's lock. It refuses the create when
// Config.MaxSandboxSessions sessions of the sandbox may still hold a shim
// (an existing id passes, as a re-create), and wakes the collector when
// more than Config.MaxSandboxEndedSessions have ended, collecting in the
// caller once twice as many have.
func (s *Manager) sessionCap(ctx context.Context, name, id string) error {
	maxLive, maxEnded := s.cfg.MaxSandboxSessions, s.cfg.MaxSandboxEndedSessions
	if maxLive <= 0 && maxEnded <= 0 {
		return nil
	}
	if err := s.bookOf(name); err != nil {
		return apierr.Unavailable("count sessions: %v", err)
	}
	s.prune(name, false)
	live, ended := s.bookCounts(name)
	if maxLive > 0 && live >= maxLive && s.awaitEnding(ctx, name) {
		live, ended = s.bookCounts(name)
	}
	if maxLive > 0 && live >= maxLive {
		if _, err := s.reg.GetSession(name, id); err == nil {
			return nil // a re-create: answered as before
		} else if !errors.Is(err, registry.ErrNotFound) {
			return apierr.Unavailable("read session: %v", err)
		}
		return apierr.Conflict("%s: sandbox %q has %d sessions running (or ended with processes left) of at most %d (runnerd --sandbox-max-sessions); wait for one to end, or terminate one (POST /v1/sandboxes/%s/sessions/{id}/terminate)", wire.DetailSessionCap, name, live, maxLive, name)
	}
	if maxEnded > 0 && ended > maxEnded {
		if ended >= 2*maxEnded {
			s.collectEnded(ctx, name) // the collector fell behind: this spawn waits for it
		} else {
			s.wakeCollector(name)
		}
	}
	return nil
}

// endingGrace bounds how long a spawn at the running cap waits for the
// shims of sessions whose command has ended: a shim syncs its journal and
// writes the exit record, then exits, within milliseconds, and an exec
// that follows the previous one's answer must not be refused for that
// moment. A session still running, or whose command ended longer ago
// than twice this (its shim waits for processes the command left), is
// never waited for.
const endingGrace = 2 * time.Second

// awaitEnding waits, at most endingGrace, until a shim of sandbox name
// whose command has ended (its journal holds the exit record) has
// exited, then prunes the book; false when no such shim was found. The
// caller holds name's lock.
func (s *Manager) awaitEnding(ctx context.Context, name string) bool {
	s.book.mu.Lock()
	var dirs []string
	for _, e := range s.book.boxes[name] {
		if !e.gone {
			dirs = append(dirs, s.Dir(registry.Session{Key: e.key}))
		}
	}
	s.book.mu.Unlock()
	var ending []string
	for _, dir := range dirs {
		// Only a command that ended a moment ago: a shim that outlives
		// its command by more (processes it started still run) is not
		// about to go, and waiting for it would hold the lock for nothing.
		if st, err := sessiondir.ReadStatus(dir); err == nil && st.State == sessiondir.StateExited &&
			st.Exit != nil && time.Since(st.Exit.Time) < 2*endingGrace {
			ending = append(ending, dir)
		}
	}
	if len(ending) == 0 {
		return false
	}
	t := time.NewTimer(endingGrace)
	defer t.Stop()
	for {
		for _, dir := range ending {
			if shimExited(dir) {
				s.prune(name, false)
				return true
			}
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return false
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// wakeCollector asks the collector to look at sandbox name's ended
// sessions. It never blocks.
func (s *Manager) wakeCollector(name string) {
	if s.cfg.MaxSandboxEndedSessions <= 0 {
		return
	}
	s.book.mu.Lock()
	s.book.pending[name] = true
	s.book.mu.Unlock()
	select {
	case s.book.wake <- struct{}{}:
	default:
	}
}

// Collector collects ended sessions past Config.MaxSandboxEndedSessions
// in the sandboxes it is woken for, until ctx ends. Run starts it and
// waits for it before the registry closes.
func (s *Manager) Collector(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.book.wake:
		}
		s.book.mu.Lock()
		names := make([]string, 0, len(s.book.pending))
		for name := range s.book.pending {
			names = append(names, name)
		}
		clear(s.book.pending)
		s.book.mu.Unlock()
		slices.Sort(names)
		for _, name := range names {
			if ctx.Err() != nil {
				return
			}
			if s.collectEnded(ctx, name) {
				time.AfterFunc(collectRetry, func() { s.wakeCollector(name) })
			}
		}
	}
}

// collectEnded deletes the oldest ended sessions of sandbox name (in
// listing order), if its book is built, while it holds more than
// Config.MaxSandboxEndedSessions,
// through Remove, as DELETE does; one it cannot delete (its shim
// still lives) is kept and the next is taken. again reports an ended
// session whose shim still lived, worth another look soon.
func (s *Manager) collectEnded(ctx context.Context, name string) (again bool) {
	max := s.cfg.MaxSandboxEndedSessions
	if max <= 0 {
		return false
	}
	return s.collectOldest(ctx, name, "max_ended", func(ended int) bool { return ended > max })
}

// collectForJournal makes room under the journal cap for a spawn in sb
// (the caller holds sb's lock): it deletes sb's oldest ended sessions,
// as collectEnded does, while its journals hold the cap. A running
// session's journal is never taken: when they alone hold the cap, the
// Spawn is refused (journalCap).
func (s *Manager) collectForJournal(ctx context.Context, sb registry.Sandbox) {
	max := s.cfg.SandboxJournalBytes
	if max <= 0 {
		return
	}
	if err := s.bookOf(sb.Name); err != nil {
		return // journalCap answers
	}
	full := func(int) bool {
		_, used, err := s.ensureBudget(sb)
		return err == nil && used >= max
	}
	s.collectOldest(ctx, sb.Name, "journal_cap", full)
	// A session whose command just ended (a terminate answered, an exec
	// right after) keeps its shim a moment: wait for it, as the running
	// cap does, and collect again.
	if full(0) && s.awaitEnding(ctx, sb.Name) {
		s.collectOldest(ctx, sb.Name, "journal_cap", full)
	}
}

// collectOldest deletes sandbox name's oldest ended sessions while over
// says the sandbox holds too much (given its count of ended sessions);
// why names the bound in the log.
func (s *Manager) collectOldest(ctx context.Context, name, why string, over func(ended int) bool) (again bool) {
	// One pass at a time: the collector's and a spawn's that found it
	// behind take the same sessions otherwise.
	s.book.collecting.Lock()
	defer s.book.collecting.Unlock()
	s.book.mu.Lock()
	_, built := s.book.boxes[name]
	s.book.mu.Unlock()
	if !built {
		// Only a spawn builds a book (under the sandbox's lock, and wakes
		// the collector when it finds too many): a wake-up for a sandbox
		// destroyed meanwhile, or not spawned in since runnerd started,
		// leaves nothing behind.
		return false
	}
	s.prune(name, true)
	cands, lingering, ended := s.collectable(name)
	if !over(ended) {
		return false
	}
	if ended = s.collectCands(ctx, name, why, cands, ended, over); !over(ended) {
		return false
	}
	// Still past the bound: the rest are ended sessions whose shim lived
	// a moment ago. Most exit just after their exit is recorded; one whose
	// processes linger is looked at collectRetries times, then again at
	// the next wake-up.
	s.book.mu.Lock()
	defer s.book.mu.Unlock()
	for _, e := range lingering {
		if e.tries < collectRetries {
			e.tries++
			again = true
		}
	}
	return again
}

// collectCand is an ended session of the book whose shim is gone.
type collectCand struct {
	id      string
	created time.Time
}

// collectable reads sandbox name's book: its ended sessions whose shim is
// gone (cands, oldest first), those whose shim is alive (lingering: not
// collectable yet) and how many ended in all.
func (s *Manager) collectable(name string) (cands []collectCand, lingering []*bookEntry, ended int) {
	s.book.mu.Lock()
	for id, e := range s.book.boxes[name] {
		if !e.exited {
			continue
		}
		ended++
		if e.gone {
			cands = append(cands, collectCand{id, e.created})
		} else {
			lingering = append(lingering, e)
		}
	}
	s.book.mu.Unlock()
	slices.SortFunc(cands, func(a, b collectCand) int {
		if c := a.created.Compare(b.created); c != 0 {
			return c
		}
		return strings.Compare(a.id, b.id)
	})
	return cands, lingering, ended
}

// collectCands deletes cands in order while over(ended) and ctx lasts,
// and returns how many ended sessions are left.
func (s *Manager) collectCands(ctx context.Context, name, why string, cands []collectCand, ended int, over func(ended int) bool) int {
	for _, c := range cands {
		if !over(ended) || ctx.Err() != nil {
			break
		}
		ss, err := s.reg.GetSession(name, c.id)
		if errors.Is(err, registry.ErrNotFound) {
			s.bookDrop(name, c.id)
			ended--
			continue
		}
		deleted := false
		if err == nil {
			deleted, err = s.deleteSession(ctx, ss) // stopping.go: DELETE's path
		}
		if err != nil {
			s.log.Debug("collect ended session: kept", "sandbox", name, "session", c.id, "err", err)
			continue
		}
		ended--
		if !deleted {
			continue // a DELETE took it meanwhile
		}
		s.metrics.SessionCollected()
		s.log.Info("ended session collected", "sandbox", name, "session", c.id, "ended", ended, "bound", why)
	}
	return ended
}
