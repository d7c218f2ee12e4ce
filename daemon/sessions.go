package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/journal"
	"github.com/agentrunner/runner/netpolicy"
	"github.com/agentrunner/runner/shim"
	"github.com/agentrunner/runner/wire"
)

// stateStarting marks a session record written before its shim was
// started, so a crash between the two is found again at the next start.
// It never crosses the wire (it reads as running).
const stateStarting = "starting"

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

func (s *server) sessionDir(ss registry.Session) string {
	return filepath.Join(s.cfg.StateDir, "s", ss.Key)
}

func journalDir(sessionDir string) string { return filepath.Join(sessionDir, "journal") }

func streamsOf(tty bool) []string {
	if tty {
		return []string{"stdout"}
	}
	return []string{"stdout", "stderr"}
}

func toWireSession(ss registry.Session) wire.Session {
	st := ss.State
	if st == stateStarting {
		st = wire.SessionRunning
	}
	return wire.Session{
		ID:        ss.ID,
		Sandbox:   ss.Sandbox,
		Argv:      ss.Request.Argv,
		TTY:       ss.Request.TTY,
		State:     st,
		PID:       ss.PID,
		StartedAt: ss.StartedAt,
		Streams:   streamsOf(ss.Request.TTY),
		Exit:      ss.Exit,
	}
}

// wireSession is toWireSession plus what only the session's files and shim
// know: the current length of each stream (the exit record's once it
// ended) and, while it runs, the shim's journal write error. Both are best
// effort: a journal or shim that does not answer leaves them out.
func (s *server) wireSession(ctx context.Context, ss registry.Session) wire.Session {
	out := toWireSession(ss)
	if out.Exit != nil {
		out.Lengths = out.Exit.Lengths
		return out
	}
	dir := s.sessionDir(ss)
	if lengths, err := journalLengths(dir); err == nil {
		out.Lengths = lengths
	}
	if ss.State == wire.SessionRunning {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if c, err := shim.Dial(sctx, dir); err == nil {
			if st, err := c.Status(sctx); err == nil {
				out.WriteError = st.WriteError
			}
			c.Close()
		}
	}
	return out
}

// journalLengths is the end offset of each stream in the journal of the
// session at dir; a stream whose bounds cannot be read is left out.
func journalLengths(dir string) (map[string]int64, error) {
	j, err := journal.Open(journalDir(dir))
	if err != nil {
		return nil, err
	}
	defer j.Close()
	lengths := map[string]int64{}
	for _, name := range j.Streams() {
		if _, end, err := j.Bounds(name); err == nil {
			lengths[name] = end
		}
	}
	return lengths, nil
}

// session looks up the session in the path: 404 not_found only when the
// registry says the sandbox or the session does not exist.
func (s *server) session(r *http.Request) (registry.Session, error) {
	name, id := r.PathValue("name"), r.PathValue("id")
	if err := validName(name); err != nil {
		return registry.Session{}, err
	}
	if err := validSessionID(id); err != nil {
		return registry.Session{}, err
	}
	ss, err := s.reg.GetSession(name, id)
	if errors.Is(err, registry.ErrNotFound) {
		if _, serr := s.sandbox(name); serr != nil {
			return ss, serr
		}
		return ss, errNotFound("session %q of sandbox %q does not exist", id, name)
	}
	if err != nil {
		return ss, errUnavailable("read registry: %v", err)
	}
	// Session ids are scoped to an incarnation: a session recorded for
	// another one than the caller names is not the caller's.
	if want, _ := r.Context().Value(incarnationKey{}).(string); want != "" && ss.Incarnation != "" && ss.Incarnation != want {
		return ss, errNotFound("sandbox %q: incarnation %s does not exist (the live one is %s)", name, want, ss.Incarnation)
	}
	return ss, nil
}

// normalize validates a spawn request and fills its defaults, so that two
// requests that mean the same compare equal.
func normalize(req *wire.CreateSession) error {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return errInvalid("argv must name a command")
	}
	for _, kv := range req.Env {
		if i := strings.IndexByte(kv, '='); i <= 0 {
			return errInvalid("env entry %q: want KEY=VALUE", kv)
		}
	}
	if req.TTY {
		if req.Rows == 0 && req.Cols == 0 {
			req.Rows, req.Cols = 24, 80
		}
		if req.Rows < 1 || req.Rows > 65535 || req.Cols < 1 || req.Cols > 65535 {
			return errInvalid("rows and cols: want 1..65535")
		}
	} else if req.Rows != 0 || req.Cols != 0 {
		return errInvalid("rows and cols apply to tty sessions only")
	}
	return nil
}

func sameRequest(a, b wire.CreateSession) bool {
	return slices.Equal(a.Argv, b.Argv) && slices.Equal(a.Env, b.Env) && a.Cwd == b.Cwd &&
		a.TTY == b.TTY && a.Rows == b.Rows && a.Cols == b.Cols
}

func envWith(env []string, key, value string) []string {
	for _, kv := range env {
		if strings.HasPrefix(kv, key+"=") {
			return env
		}
	}
	return append(env, key+"="+value)
}

// spawn starts a session and returns it once its command runs. created is
// false when id named an existing session started by the same request.
// spawnOptions are what a spawn's caller inside runnerd may add to the
// request.
type spawnOptions struct {
	// stdinClosed starts the command with stdin at EOF (an exec with no
	// stdin): no close-stdin round trip after the start.
	stdinClosed bool
}

// specFor is what the shim of session ss in sandbox sb runs; nsb is the
// sandbox's network namespace, if contained. A cwd that is not a directory
// is the caller's error.
func (s *server) specFor(sb registry.Sandbox, ss registry.Session, nsb *netpolicy.Sandbox, opts spawnOptions) (shim.Spec, error) {
	req := ss.Request
	cwd := sb.Workspace
	if req.Cwd != "" {
		cwd = req.Cwd
		if !filepath.IsAbs(cwd) {
			cwd = filepath.Join(sb.Workspace, cwd)
		}
	}
	if fi, err := os.Stat(cwd); err != nil || !fi.IsDir() {
		return shim.Spec{}, errInvalid("cwd %q is not a directory", req.Cwd)
	}
	env := envWith(slices.Clone(req.Env), "PATH", defaultPath)
	env = envWith(env, "HOME", sb.Workspace)
	if req.TTY {
		env = envWith(env, "TERM", "xterm-256color")
	}
	spec := shim.Spec{
		ID:   ss.ID,
		Argv: req.Argv,
		Env:  env,
		Dir:  cwd,
		User: sb.User,
		TTY:  req.TTY,
		Rows: uint16(req.Rows),
		Cols: uint16(req.Cols),
		// Opt-in (--journal-retain-bytes): a reader behind the retained
		// start is answered truncated, never silently skipped.
		RetainBytes: s.cfg.JournalRetainBytes,
		StdinClosed: opts.stdinClosed && !req.TTY,
	}
	if nsb != nil {
		spec.NetNS, spec.ResolvConf = nsb.NetNSPath, nsb.ResolvConfPath
	}
	return spec, nil
}

// netReady returns sb's network namespace when it needs nothing set up:
// none (not contained), or one this runnerd has already made. ok is
// false when netFor would have work to do.
func (s *server) netReady(sb registry.Sandbox) (nsb *netpolicy.Sandbox, ok bool) {
	if sb.Network == nil {
		return nil, true
	}
	if s.net == nil {
		return nil, false
	}
	s.netMu.Lock()
	defer s.netMu.Unlock()
	nsb = s.nets[netID(sb.Name, sb.Incarnation)]
	return nsb, nsb != nil
}

func (s *server) spawn(ctx context.Context, name string, req wire.CreateSession, opts spawnOptions) (ss registry.Session, created bool, err error) {
	if err := normalize(&req); err != nil {
		return ss, false, err
	}
	if req.ID == "" {
		req.ID = registry.NewID()
	} else if err := validSessionID(req.ID); err != nil {
		return ss, false, err
	}
	// Locked first: the warm path below builds the command's spec (its
	// network namespace too) from live, and a policy change holds this
	// lock while it commits and sets up the namespace.
	unlock := s.locks.Lock(name)
	defer unlock()
	live, err := s.sandbox(name)
	if err != nil {
		return ss, false, err
	}

	ss = registry.Session{
		Sandbox:     name,
		ID:          req.ID,
		Incarnation: live.Incarnation, // stored with the record: the session routes check it
		Key:         registry.NewID(),
		Request:     req,
		State:       stateStarting,
		StartedAt:   time.Now().UTC(),
	}
	// With a warm shim idle, the shim prepares the session (makes its
	// directory, journal and spec.json, opens the command's pipes) while
	// the record's fsync runs, and starts the command only after it
	// (Prepared.Start): a record is durable before its command runs, and
	// the spawn waits for the longer of the two, not both. Anything this
	// cannot settle from the sandbox as read (a cwd to report, a network
	// namespace to set up) takes the path below, in order.
	var pre *shim.Prepared
	var preNet *netpolicy.Sandbox
	if s.cfg.pool != nil && live.State != wire.SandboxSuspended {
		if nsb, ok := s.netReady(live); ok {
			if spec, err := s.specFor(live, ss, nsb, opts); err == nil {
				if pre, _ = s.cfg.pool.Prepare(s.sessionDir(ss), spec); pre != nil {
					preNet = nsb
				}
			}
		}
	}
	var sb registry.Sandbox
	cur, err := s.reg.CreateSession(ss, func(rec registry.Sandbox) error {
		if err := checkIncarnation(ctx, rec); err != nil {
			return err
		}
		if rec.State == wire.SandboxSuspended {
			return errConflict("sandbox suspended")
		}
		if rec.Incarnation != ss.Incarnation {
			return errUnavailable("sandbox %q was re-created during the spawn; retry", name)
		}
		sb = rec
		return nil
	})
	if pre != nil && (err != nil || !reflect.DeepEqual(sb.Network, live.Network)) {
		// Its directory is removed, its command never runs. A sandbox
		// whose network changed since live was read (the lock makes it
		// impossible; checked all the same, since a command outside its
		// policy is the one thing a spawn must never do) starts below,
		// from the committed record.
		pre.Cancel()
		pre = nil
	}
	switch {
	case errors.Is(err, registry.ErrExists):
		if !sameRequest(cur.Request, req) {
			return ss, false, errConflict("%s: session %q exists with a different request", wire.DetailConflict, req.ID)
		}
		cur, err = s.refresh(cur)
		if err == nil && cur.State == stateStarting {
			err = errUnavailable("%s: session %q is still starting; retry with the same id", wire.DetailUncertain, req.ID)
		}
		return cur, false, err
	case errors.Is(err, registry.ErrNotFound):
		return ss, false, errNotFound("sandbox %q does not exist", name)
	case err != nil:
		return ss, false, s.registryErr(err, name)
	}

	fail := func(err error) (registry.Session, bool, error) {
		os.RemoveAll(s.sessionDir(ss))
		if derr := s.reg.DeleteSession(name, ss.ID); derr != nil {
			s.log.Error("forget failed session", "sandbox", name, "session", ss.ID, "err", derr)
		}
		return ss, false, err
	}
	// The shim outlives this request: a client that goes away must not
	// cancel a start half-way. Bound it instead.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shimStartTimeout)
	defer cancel()
	var (
		st  shim.Status
		nsb *netpolicy.Sandbox
	)
	if pre != nil {
		nsb = preNet
		st, err = pre.Start(sctx)
	} else {
		if nsb, err = s.netFor(sctx, sb); err != nil {
			return fail(err)
		}
		var spec shim.Spec
		if spec, err = s.specFor(sb, ss, nsb, opts); err != nil {
			return fail(err)
		}
		st, err = s.startShim(sctx, s.sessionDir(ss), spec)
	}
	if err != nil && startMayRun(err) {
		// Not removed: the record (starting) and directory stay, so
		// refresh finds whatever comes up, and a retry of this id attaches
		// to it instead of starting a second process.
		s.log.Warn("session start uncertain", "sandbox", name, "session", ss.ID, "err", err)
		return ss, false, errUnavailable("%s: the session may be starting; retry with the same id: %v", wire.DetailUncertain, err)
	}
	if err != nil {
		return fail(classifyStart(err))
	}
	if nsb != nil {
		// Advertise or refuse, never pretend: a contained sandbox's command
		// that is not in the namespace is killed, and the spawn fails.
		if verr := verifyNetNS(st.PID, nsb.NetNSPath, s.sessionDir(ss)); verr != nil {
			s.log.Error("session escaped its sandbox's network namespace; killing it", "sandbox", name, "session", ss.ID, "err", verr)
			if kerr := s.killUnverified(sctx, s.sessionDir(ss)); kerr != nil {
				// Not removed: the record (starting) and directory stay, so
				// the next refresh or restart finds what still runs.
				return ss, false, errUnavailable("%s: session %s is not contained (%v) and could not be stopped: %v", wire.DetailUncertain, ss.ID, verr, kerr)
			}
			return fail(errUnavailable("start session in the sandbox's network namespace: %v", verr))
		}
	}
	ss.State, ss.PID = wire.SessionRunning, st.PID
	if !st.StartedAt.IsZero() {
		ss.StartedAt = st.StartedAt.UTC()
	}
	s.metrics.sessionsStarted.Add(1)
	s.log.Info("session started", "sandbox", name, "session", ss.ID, "pid", st.PID, "tty", req.TTY)
	s.recordRunning(ss)
	return ss, true, nil
}

// recordRunning records a started session as running, after its answer
// rather than before: "starting" is durable already, so the
// acknowledgement need not wait for a second fsync. Only a record still
// starting, of this spawn, is changed.
func (s *server) recordRunning(ss registry.Session) {
	s.commitLater(ss, "record session running", func(rec *registry.Session) {
		if rec.State == stateStarting {
			rec.State, rec.PID, rec.StartedAt = ss.State, ss.PID, ss.StartedAt
		}
	})
}

// endedState is the state of a session that ended with exit.
func endedState(exit wire.Exit) string {
	if exit.Reason == wire.ExitLost {
		return wire.SessionLost
	}
	return wire.SessionExited
}

// recordExitLater records exit, already in the session's journal, after
// the answer that reports it (attach's terminal frame, exec's result, a
// stream's end), so that no answer waits for the registry's fsync. Only a
// record of the same spawn that has not ended is changed.
func (s *server) recordExitLater(ss registry.Session, exit wire.Exit) {
	state := endedState(exit)
	s.commitLater(ss, "record session exit", func(rec *registry.Session) {
		if rec.State == wire.SessionRunning || rec.State == stateStarting {
			rec.State, rec.Exit = state, &exit
		}
	})
}

// commitLater updates ss's record with change after the answer in hand,
// in a goroutine the server tracks, and only if the record is still ss's
// spawn (same key). Until it lands, readers that must see what a
// synchronous commit would have shown wait for it (settled); others read
// the truth from the shim and journal anyway (refresh).
func (s *server) commitLater(ss registry.Session, what string, change func(*registry.Session)) {
	k := pendingKey(ss.Sandbox, ss.ID)
	landed := make(chan struct{})
	s.pendingMu.Lock()
	s.pending[k] = append(s.pending[k], landed)
	s.pendingMu.Unlock()
	s.later(func() {
		defer func() {
			s.pendingMu.Lock()
			if rest := slices.DeleteFunc(s.pending[k], func(c chan struct{}) bool { return c == landed }); len(rest) > 0 {
				s.pending[k] = rest
			} else {
				delete(s.pending, k)
			}
			s.pendingMu.Unlock()
			close(landed)
		}()
		_, err := s.reg.UpdateSession(ss.Sandbox, ss.ID, func(rec *registry.Session) error {
			if rec.Key == ss.Key {
				change(rec)
			}
			return nil
		})
		if err != nil && !errors.Is(err, registry.ErrNotFound) {
			s.log.Warn(what+" (the next read settles it from the shim)", "sandbox", ss.Sandbox, "session", ss.ID, "err", err)
		}
	})
}

// later runs fn in a goroutine the server tracks (Run waits for it), or
// at once when Run is stopping: work that must be done but need not be
// waited for by the answer in hand.
func (s *server) later(fn func()) {
	if done, ok := s.track(); ok {
		go func() {
			defer done()
			fn()
		}()
		return
	}
	fn()
}

func pendingKey(sandbox, id string) string { return sandbox + "/" + id }

// pendingFor returns the deferred commits of a session pending now. Taken
// before a registry read, it closes the window in which a commit lands
// between that read and the check.
func (s *server) pendingFor(sandbox, id string) []chan struct{} {
	s.pendingMu.Lock()
	defer s.pendingMu.Unlock()
	return slices.Clone(s.pending[pendingKey(sandbox, id)])
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

// settled returns ss's record once the deferred commits pending for it
// have landed, re-read in any case: one may have landed between the
// caller's read of ss and now. For a record still starting, which refresh
// would otherwise resolve from the shim's files.
func (s *server) settled(ss registry.Session) registry.Session {
	awaitLanded(s.pendingFor(ss.Sandbox, ss.ID))
	if cur, err := s.reg.GetSession(ss.Sandbox, ss.ID); err == nil && cur.Key == ss.Key {
		return cur
	}
	return ss
}

// shimStartTimeout bounds a spawn's shim start (a variable for tests).
var shimStartTimeout = 30 * time.Second

// startMayRun reports whether a failed shim start may still leave a shim,
// and so the command, running: the wait for its report ended (a context
// error), or no shim reported at all (a StartError with neither a shim
// pid nor a phase: it died, or garbled its line, at a point nobody
// knows). A reported StartError is definite (the shim removed what it
// created and exits), as is a failure before any shim was launched.
func startMayRun(err error) bool {
	var se *shim.StartError
	if errors.As(err, &se) {
		return se.ShimPID == 0 && se.Phase == ""
	}
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

// startShim starts the session's shim through a warm one when the pool
// has one idle, cold otherwise: the same readiness, errors and detachment.
func (s *server) startShim(ctx context.Context, dir string, spec shim.Spec) (shim.Status, error) {
	if s.cfg.pool != nil {
		return s.cfg.pool.Start(ctx, dir, spec)
	}
	return shim.Start(ctx, s.cfg.ShimCommand, dir, spec)
}

// refresh brings a running session's record up to date with its shim's
// own status: exited (the exit record), lost (the shim died without one:
// the journal is finished as lost so every reader agrees), or running.
func (s *server) refresh(ss registry.Session) (registry.Session, error) {
	if ss.State == stateStarting {
		ss = s.settled(ss)
	}
	if ss.State == stateStarting {
		var err error
		if ss, err = s.resolveStarting(ss); err != nil || ss.State != wire.SessionRunning {
			return ss, err
		}
	}
	if ss.State != wire.SessionRunning {
		return ss, nil
	}
	dir := s.sessionDir(ss)
	st, err := shim.ReadStatus(dir)
	if err != nil {
		return ss, errUnavailable("read session status: %v", err)
	}
	var exit wire.Exit
	switch st.State {
	case "exited":
		if st.Exit == nil {
			return ss, nil
		}
		exit = shim.WireExit(*st.Exit)
	case "lost":
		e, err := finishLost(dir, "session supervisor died without an exit record")
		if err != nil {
			return ss, err
		}
		exit = shim.WireExit(e)
	default:
		return ss, nil
	}
	return s.recordExit(ss, exit)
}

// resolveStarting settles a session recorded as starting from its shim's
// own files: running (with the command's pid) once the shim wrote
// started.json; lost, "never started", once its shim is provably gone
// without having started the command; still starting otherwise.
func (s *server) resolveStarting(ss registry.Session) (registry.Session, error) {
	dir := s.sessionDir(ss)
	st, err := shim.ReadStatus(dir)
	if err == nil {
		out, err := s.reg.UpdateSession(ss.Sandbox, ss.ID, func(rec *registry.Session) error {
			if rec.State == stateStarting {
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
			return ss, errUnavailable("record session: %v", err)
		}
		return out, nil
	}
	if shimMayLive(dir, ss.StartedAt) {
		// Not started yet, or mid-setup (its files half made): a shim
		// that may still come up leaves the session starting, whatever
		// its files say this instant.
		return ss, nil
	}
	if !errors.Is(err, shim.ErrNoSession) {
		return ss, errUnavailable("read session status: %v", err)
	}
	// Either it never started, or it started and its files went with a
	// power loss before they were durable (the record's "running" commit
	// comes after the answer, so a record can still say starting): the
	// detail says both, never only the first.
	e, err := finishLost(dir, "the session never started, or its files were lost (power loss?): its supervisor is gone")
	if err != nil {
		return ss, err
	}
	return s.recordExit(ss, shim.WireExit(e))
}

// shimMayLive reports whether a shim of the session directory dir, which
// has not started its command yet, may still be alive: while a spawn
// begun at since may still be starting it, while shim.pid names a live
// process, or while any process has dir's shim.log as its stdout or
// stderr (every shim does from its detach on, before shim.pid). Only
// false is a proof.
func shimMayLive(dir string, since time.Time) bool {
	if time.Since(since) < shimStartTimeout+5*time.Second {
		return true
	}
	if b, err := os.ReadFile(filepath.Join(dir, shim.PIDFile)); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
			if err := unix.Kill(pid, 0); err == nil || errors.Is(err, unix.EPERM) {
				return true
			}
		}
	}
	logPath := filepath.Join(dir, shim.LogFile)
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

// recordExit stores a session's exit record.
func (s *server) recordExit(ss registry.Session, exit wire.Exit) (registry.Session, error) {
	state := endedState(exit)
	out, err := s.reg.UpdateSession(ss.Sandbox, ss.ID, func(rec *registry.Session) error {
		rec.State = state
		rec.Exit = &exit
		return nil
	})
	if errors.Is(err, registry.ErrNotFound) {
		ss.State, ss.Exit = state, &exit
		return ss, nil // destroyed meanwhile; the answer is still true
	}
	if err != nil {
		return ss, errUnavailable("record exit: %v", err)
	}
	return out, nil
}

// reconcile runs once at start: every session the registry thinks is
// running (or was starting when runnerd died) is checked against its shim,
// then the session directories no record names are removed (removeOrphans).
func (s *server) reconcile(ctx context.Context) error {
	all, err := s.reg.AllSessions()
	if err != nil {
		return err
	}
	for _, ss := range all {
		if ss.State == stateStarting {
			// Running once its shim started the command, lost once the
			// shim is provably gone without, starting (and resolved by a
			// later refresh) while it may still come up.
			if ss, err = s.resolveStarting(ss); err != nil {
				s.log.Warn("recover session", "sandbox", ss.Sandbox, "session", ss.ID, "err", err)
				continue
			}
		}
		if ss.State != wire.SessionRunning {
			continue
		}
		if _, err := shim.ReadStatus(s.sessionDir(ss)); errors.Is(err, shim.ErrNoSession) || errors.Is(err, fs.ErrNotExist) {
			// A running record is written only after the shim's files
			// exist; files that are gone at start were lost to a power
			// loss (none is fsynced before the ack; see journal's fsync
			// policy), and the session with them.
			e, ferr := finishLost(s.sessionDir(ss), "the session's files were lost (power loss?)")
			if ferr == nil {
				s.recordExit(ss, shim.WireExit(e))
				s.log.Warn("session lost with its files", "sandbox", ss.Sandbox, "session", ss.ID)
				continue
			}
		}
		out, err := s.refresh(ss)
		if err != nil {
			s.log.Warn("recover session", "sandbox", ss.Sandbox, "session", ss.ID, "err", err)
			continue
		}
		s.log.Info("session found", "sandbox", ss.Sandbox, "session", ss.ID, "state", out.State)
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
func (s *server) removeOrphans(known []registry.Session) {
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
		if shimMayLive(dir, fi.ModTime()) {
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

// terminate stops a session (SIGTERM, SIGKILL after grace) and every
// process it started, also those that outlived an ended command, and
// returns its exit record once it is in the journal. An outcome it cannot
// confirm is unavailable "uncertain".
func (s *server) terminate(ctx context.Context, ss registry.Session, grace time.Duration) (registry.Session, error) {
	ss, err := s.refresh(ss)
	if err != nil {
		return ss, err
	}
	if ss.State == stateStarting {
		// Its shim may still start the command: never report it stopped.
		return ss, errUnavailable("%s: session %s is still starting; retry", wire.DetailUncertain, ss.ID)
	}
	if ss.State != wire.SessionRunning {
		if err := s.stopLingering(ctx, ss, grace); err != nil {
			return ss, errUnavailable("%s: %v", wire.DetailUncertain, err)
		}
		return ss, nil
	}
	uncertain := func(cause error) (registry.Session, error) {
		if again, rerr := s.refresh(ss); rerr == nil && again.State != wire.SessionRunning {
			return again, nil
		}
		return ss, errUnavailable("%s: %v", wire.DetailUncertain, cause)
	}
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace+5*time.Second)
	defer cancel()
	c, err := shim.Dial(tctx, s.sessionDir(ss))
	if err != nil {
		return uncertain(err)
	}
	defer c.Close()
	e, err := c.Terminate(tctx, grace)
	if errors.Is(err, shim.ErrWriteFailed) {
		// The command has ended but its exit record cannot be written
		// (disk full): say so now rather than wait out the deadline. The
		// shim publishes the record once there is space.
		return ss, err
	}
	if err != nil {
		return uncertain(err)
	}
	ss, err = s.recordExit(ss, shim.WireExit(e))
	if err == nil {
		if lerr := s.stopLingering(ctx, ss, grace); lerr != nil {
			return uncertain(lerr)
		}
	}
	return ss, err
}

// stopSessions terminates every session in parallel: the running ones,
// and the processes that outlived the command of an ended one (terminate).
func (s *server) stopSessions(ctx context.Context, sessions []registry.Session, grace time.Duration) error {
	var wg sync.WaitGroup
	errs := make([]error, len(sessions))
	for i, ss := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = s.terminate(ctx, ss, grace)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return errUnavailable("%s: stop sessions: %v", wire.DetailUncertain, err)
	}
	return nil
}

// stopLingering stops the processes a session started that outlived its
// command (a shim keeps them, as their subreaper, until they are gone or
// terminated) and confirms that none is left: an error when it cannot.
func (s *server) stopLingering(ctx context.Context, ss registry.Session, grace time.Duration) error {
	dir := s.sessionDir(ss)
	n, err := lingering(ctx, dir)
	if err != nil || n == 0 {
		return err
	}
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace+10*time.Second)
	defer cancel()
	c, err := shim.Dial(tctx, dir)
	if err != nil {
		return fmt.Errorf("session %s: %w", ss.ID, err)
	}
	defer c.Close()
	if _, err := c.Terminate(tctx, grace); err != nil && !errors.Is(err, shim.ErrLost) {
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
	if _, err := os.Stat(filepath.Join(dir, shim.SocketFile)); errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := shim.Dial(ctx, dir)
	if errors.Is(err, shim.ErrNoSession) {
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

func (s *server) handleCreateSession(w http.ResponseWriter, r *http.Request) {
	var req wire.CreateSession
	if err := decodeJSON(w, r, &req, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	ss, created, err := s.spawn(r.Context(), r.PathValue("name"), req, spawnOptions{})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if created {
		// The command started an instant ago: answer from the record the
		// spawn already holds. Opening the journal for lengths that are
		// about zero and asking the shim for a write error it cannot have
		// yet cost a journal open and a socket round trip on every spawn
		// (docs/benchmarks.md, the step-by-step spawn); GET has them.
		s.writeJSON(w, http.StatusCreated, toWireSession(ss))
		return
	}
	s.writeJSON(w, http.StatusOK, s.wireSession(r.Context(), ss))
}

func (s *server) handleListSessions(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if _, err := s.sandbox(name); err != nil {
		s.writeError(w, r, err)
		return
	}
	list, err := s.reg.ListSessions(name)
	if err != nil {
		s.writeError(w, r, errUnavailable("read registry: %v", err))
		return
	}
	out := wire.SessionList{Sessions: make([]wire.Session, 0, len(list))}
	for _, rec := range list {
		ss, err := s.refresh(rec)
		if err != nil {
			// One unreadable session does not hide the others: it is
			// listed as last recorded, and says so.
			ws := toWireSession(rec)
			ws.StatusError = statusDetail(err)
			s.log.Warn("list sessions: refresh", "sandbox", rec.Sandbox, "session", rec.ID, "err", err)
			out.Sessions = append(out.Sessions, ws)
			continue
		}
		out.Sessions = append(out.Sessions, s.wireSession(r.Context(), ss))
	}
	s.writeJSON(w, http.StatusOK, out)
}

// statusDetail is what a listed session's status_error says: an API
// error's detail, any other error's text.
func statusDetail(err error) string {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.detail
	}
	return err.Error()
}

func (s *server) handleGetSession(w http.ResponseWriter, r *http.Request) {
	ss, err := s.session(r)
	if err == nil {
		ss, err = s.refresh(ss)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, s.wireSession(r.Context(), ss))
}

// control runs fn against the shim of ss, which the caller looked up with
// s.session (one registry read per request). A session that ended (or
// whose shim answers that it did) is command_exited.
func (s *server) control(w http.ResponseWriter, r *http.Request, ss registry.Session, fn func(ctx context.Context, c *shim.Client) error) {
	ss, err := s.refresh(ss)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if ss.State != wire.SessionRunning && ss.State != stateStarting {
		s.writeError(w, r, errCommandExited())
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	c, err := shim.Dial(ctx, s.sessionDir(ss))
	if err == nil {
		err = fn(ctx, c)
		c.Close()
	}
	if err != nil {
		if !errors.Is(err, shim.ErrExited) {
			// The shim may have gone between the status and the call.
			if again, rerr := s.refresh(ss); rerr == nil && again.State != wire.SessionRunning {
				err = shim.ErrExited
			}
		}
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *server) handleStdin(w http.ResponseWriter, r *http.Request) {
	// The session is looked up (and its incarnation checked) before the
	// body is read: a request for a session that is not there, not the
	// caller's, or ended costs no MaxStdinBody buffer.
	// An exit recorded after the answer that reported it (commitLater)
	// is waited for: a client that saw the exit gets command_exited.
	pend := s.pendingFor(r.PathValue("name"), r.PathValue("id"))
	ss, err := s.session(r)
	if err == nil && len(pend) > 0 && ss.State == wire.SessionRunning {
		awaitLanded(pend)
		ss, err = s.session(r)
	}
	if err == nil && ss.State != wire.SessionRunning && ss.State != stateStarting {
		err = errCommandExited()
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, wire.MaxStdinBody))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.control(w, r, ss, func(ctx context.Context, c *shim.Client) error {
		if len(body) == 0 {
			return nil
		}
		return c.WriteStdin(ctx, body)
	})
}

func (s *server) handleCloseStdin(w http.ResponseWriter, r *http.Request) {
	ss, err := s.session(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.control(w, r, ss, func(ctx context.Context, c *shim.Client) error { return c.CloseStdin(ctx) })
}

func (s *server) handleResize(w http.ResponseWriter, r *http.Request) {
	var req wire.Resize
	if err := decodeJSON(w, r, &req, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.Rows < 1 || req.Rows > 65535 || req.Cols < 1 || req.Cols > 65535 {
		s.writeError(w, r, errInvalid("rows and cols: want 1..65535"))
		return
	}
	ss, err := s.session(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if !ss.Request.TTY {
		s.writeError(w, r, errInvalid("resize applies to tty sessions only"))
		return
	}
	s.control(w, r, ss, func(ctx context.Context, c *shim.Client) error {
		return c.Resize(ctx, uint16(req.Rows), uint16(req.Cols))
	})
}

// parseSignal accepts "TERM", "SIGTERM", "15" (wire.ParseSignal).
func parseSignal(v wire.SignalName) (unix.Signal, error) {
	n, err := wire.ParseSignal(string(v))
	if err != nil {
		return 0, errInvalid("%v", err)
	}
	return unix.Signal(n), nil
}

func (s *server) handleSignal(w http.ResponseWriter, r *http.Request) {
	var req wire.Signal
	if err := decodeJSON(w, r, &req, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	sig, err := parseSignal(req.Signal)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ss, err := s.session(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.control(w, r, ss, func(ctx context.Context, c *shim.Client) error { return c.Signal(ctx, sig) })
}

func (s *server) handleTerminate(w http.ResponseWriter, r *http.Request) {
	var req wire.Terminate
	if err := decodeJSON(w, r, &req, true); err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.GraceMS == 0 {
		req.GraceMS = 10000
	}
	if req.GraceMS < 1 || req.GraceMS > wire.MaxGraceMS {
		s.writeError(w, r, errInvalid("grace_ms: want 1..%d", wire.MaxGraceMS))
		return
	}
	ss, err := s.session(r)
	if err == nil {
		ss, err = s.terminate(r.Context(), ss, time.Duration(req.GraceMS)*time.Millisecond)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, ss.Exit)
}

func (s *server) handleDeleteSession(w http.ResponseWriter, r *http.Request) {
	ss, err := s.session(r)
	if err == nil {
		err = s.removeSession(r.Context(), ss)
	}
	var ae *apiError
	if err != nil && !(errors.As(err, &ae) && ae.code == wire.CodeNotFound) {
		// Absent is success, like a sandbox destroy: so is a sandbox, or
		// an incarnation, that is gone, and every session with it.
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// errSessionLive is returned by removeSession's registry check when the
// record changed to a live state under it.
var errSessionLive = errors.New("session is live")

// removeSession deletes an ended session: its record, then its directory
// (journal included). A session that runs, is starting, or whose shim
// still lives (processes it started outlived the command) is refused with
// 409 invalid: terminate it first. The record goes first, so a crash in
// between leaves an unreferenced directory (removed at the next start,
// removeOrphans), never a record without files.
func (s *server) removeSession(ctx context.Context, ss registry.Session) error {
	ss, err := s.refresh(ss)
	if err != nil {
		return err
	}
	if ss.State == wire.SessionRunning || ss.State == stateStarting {
		return errConflict("session %s is running; terminate it first", ss.ID)
	}
	dir := s.sessionDir(ss)
	if err := shimGone(ctx, dir, ss.ID); err != nil {
		return err
	}
	err = s.reg.DeleteSessionIf(ss.Sandbox, ss.ID, func(cur registry.Session) error {
		if cur.Key != ss.Key || cur.State == wire.SessionRunning || cur.State == stateStarting {
			return errSessionLive
		}
		return nil
	})
	if errors.Is(err, errSessionLive) {
		return errConflict("session %s changed during the delete; retry", ss.ID)
	}
	if err != nil {
		return errUnavailable("delete session record: %v", err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return errUnavailable("remove session %s: %v", ss.ID, err)
	}
	s.log.Info("session deleted", "sandbox", ss.Sandbox, "session", ss.ID)
	return nil
}

// shimGone returns nil once the shim of the ended session in dir is gone
// (shimMayLive proves it), and 409 invalid while it lives because
// processes the session started still run. A shim that lives with none
// (it is exiting) is waited for briefly.
func shimGone(ctx context.Context, dir, id string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for {
		if !shimMayLive(dir, time.Time{}) {
			return nil
		}
		if n, err := lingering(ctx, dir); err == nil && n != 0 {
			return errConflict("session %s ended but %d process(es) it started still run; terminate it first", id, n)
		}
		select {
		case <-ctx.Done():
			return errConflict("session %s ended but its supervisor still runs; terminate it first", id)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// janitor deletes, every cfg.JanitorInterval until stop is closed, the
// ended sessions whose exit is older than cfg.SessionRetention, exactly as
// DELETE does; a session it cannot delete yet (its shim lives) is tried
// again at the next tick.
func (s *server) janitor(stop <-chan struct{}) {
	t := time.NewTicker(s.cfg.JanitorInterval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		s.collect(stop)
	}
}

// collect is one janitor pass.
func (s *server) collect(stop <-chan struct{}) {
	all, err := s.reg.AllSessions()
	if err != nil {
		s.log.Warn("session janitor: read registry", "err", err)
		return
	}
	ctx, cancel := contextWithStop(context.Background(), stop)
	defer cancel()
	for _, ss := range all {
		if ctx.Err() != nil {
			return
		}
		if ss, err = s.refresh(ss); err != nil || ss.Exit == nil {
			continue
		}
		ended := ss.Exit.Time
		if ended.IsZero() {
			ended = ss.StartedAt
		}
		if time.Since(ended) < s.cfg.SessionRetention {
			continue
		}
		if err := s.removeSession(ctx, ss); err != nil {
			s.log.Debug("session janitor: keep session", "sandbox", ss.Sandbox, "session", ss.ID, "err", err)
		}
	}
}
