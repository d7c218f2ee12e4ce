package sessions

// The spawn path: from a validated request to a running command under its
// own shim. The HTTP surface is in sessions.go and exec.go.

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/agentrunner/runner/daemon/apierr"
	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/daemon/sandboxes"
	"github.com/agentrunner/runner/netpolicy"
	"github.com/agentrunner/runner/shim/launch"
	"github.com/agentrunner/runner/shim/sessiondir"
	"github.com/agentrunner/runner/wire"
	"golang.org/x/sys/unix"
)

// normalize validates a spawn request and fills its defaults, so that two
// requests that mean the same compare equal.
func normalize(req *wire.CreateSession) error {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return apierr.Invalid("argv must name a command")
	}
	if err := noNUL(req); err != nil {
		return err
	}
	for _, kv := range req.Env {
		if i := strings.IndexByte(kv, '='); i <= 0 {
			return apierr.Invalid("env entry %q: want KEY=VALUE", kv)
		}
	}
	if req.TTY {
		if req.Rows == 0 && req.Cols == 0 {
			req.Rows, req.Cols = 24, 80
		}
		if err := ValidTermSize(req.Rows, req.Cols); err != nil {
			return err
		}
	} else if req.Rows != 0 || req.Cols != 0 {
		return apierr.Invalid("rows and cols apply to tty sessions only")
	}
	if req.TTY && req.MergeStderr {
		return apierr.Invalid("merge_stderr applies to pipes sessions only (a tty has one stream)")
	}
	return nil
}

// ValidTermSize checks a terminal size: each side fits the uint16 of
// TIOCSWINSZ and is at least 1.
func ValidTermSize(rows, cols int) error {
	if rows < 1 || rows > 65535 || cols < 1 || cols > 65535 {
		return apierr.Invalid("rows and cols: want 1..65535")
	}
	return nil
}

func sameRequest(a, b wire.CreateSession) bool {
	return slices.Equal(a.Argv, b.Argv) && slices.Equal(a.Env, b.Env) && a.Cwd == b.Cwd && a.User == b.User &&
		a.TTY == b.TTY && a.Rows == b.Rows && a.Cols == b.Cols && a.MergeStderr == b.MergeStderr
}

func envWith(env []string, key, value string) []string {
	for _, kv := range env {
		if strings.HasPrefix(kv, key+"=") {
			return env
		}
	}
	return append(env, key+"="+value)
}

// SpawnOptions are what a spawn's caller inside runnerd may add to the
// request.
type SpawnOptions struct {
	// StdinClosed starts the command with stdin at EOF (an exec with no
	// stdin): no close-stdin round trip after the start.
	StdinClosed bool
}

// specFor is what the shim of session ss in sandbox sb runs; nsb is the
// sandbox's network namespace, if contained, and pod its pod, if it is
// one (sandboxes.PodFor). A cwd that is not a directory is the caller's
// error.
func (s *Manager) specFor(sb registry.Sandbox, ss registry.Session, nsb *netpolicy.Sandbox, pref *sessiondir.PodRef, opts SpawnOptions) (sessiondir.Spec, error) {
	req := ss.Request
	home := sb.Workspace
	if sandboxes.InPod(sb) {
		home = podWorkspace
	}
	env := envWith(slices.Clone(req.Env), "PATH", sessiondir.DefaultPath)
	env = envWith(env, "HOME", home)
	if lang := defaultLang(); lang != "" { // locale.go
		env = envWith(env, "LANG", lang)
	}
	if req.TTY {
		env = envWith(env, "TERM", "xterm-256color")
	}
	spec := sessiondir.Spec{
		ID:      ss.ID,
		Sandbox: sb.Name,
		Argv:    req.Argv,
		Env:     env,
		User:    sb.User,
		TTY:     req.TTY,
		Rows:    uint16(req.Rows),
		Cols:    uint16(req.Cols),
		// Opt-in (--journal-retain-bytes): a reader behind the retained
		// start is answered truncated, never silently skipped.
		RetainBytes: s.cfg.JournalRetainBytes,
		StdinClosed: opts.StdinClosed && !req.TTY,
		MergeStderr: req.MergeStderr,
	}
	var err error
	switch {
	case sandboxes.InPod(sb):
		err = s.podSpec(sb, pref, req, &spec)
	case req.User != "":
		err = apierr.Invalid("user %q: a session's user applies to a pod sandbox (runnerd --isolate pod); this sandbox's commands run as its identity", req.User)
	default:
		err = s.hostSpec(sb, nsb, req.Cwd, &spec)
	}
	if err != nil {
		return sessiondir.Spec{}, err
	}
	if spec.Cgroups, err = s.sbx.SessionCgroups(sb, ss); err != nil { // limits.go
		return sessiondir.Spec{}, err
	}
	if err := s.journalCap(sb, &spec); err != nil { // journalcap.go
		return sessiondir.Spec{}, err
	}
	return spec, nil
}

// hostSpec is specFor's part for a sandbox that is not a pod: what the
// shim's helper makes at this start (namespaces, binds, the user switch).
func (s *Manager) hostSpec(sb registry.Sandbox, nsb *netpolicy.Sandbox, reqCwd string, spec *sessiondir.Spec) error {
	var err error
	if spec.Dir, spec.DirRoot, err = s.cwdFor(sb, reqCwd); err != nil {
		return err
	}
	if nsb != nil {
		spec.NetNS, spec.ResolvConf = nsb.NetNSPath, nsb.ResolvConfPath
	}
	if err := s.sbx.IsolateSpec(sb, spec); err != nil { // identity.go
		return err
	}
	if spec.Binds, err = s.sbx.PrivateBinds(sb); err != nil { // privatetmp.go
		return err
	}
	if s.sbx.IdentitiesEnabled() && s.sbx.Isolated(sb) {
		spec.Hostname = sb.Name // its own UTS namespace: the host's name is not its business
	}
	return nil
}

// podSpec is specFor's part for a sandbox that is a pod: the command
// joins pod (nothing is made at this start), as the sandbox's user
// inside, in the cwd as the pod sees it (podCwd).
func (s *Manager) podSpec(sb registry.Sandbox, pref *sessiondir.PodRef, req wire.CreateSession, spec *sessiondir.Spec) error {
	if pref == nil {
		return apierr.Unavailable("sandbox %q: its pod is not running", sb.Name)
	}
	var err error
	if spec.Dir, err = podCwd(sb, req.Cwd); err != nil {
		return err
	}
	return s.sbx.PodSpec(sb, pref, req.User, spec) // pods.go
}

// podWorkspace is where a pod's commands see its workspace (pod.WorkspacePath).
const podWorkspace = sandboxes.PodWorkspace

// podCwd is a spawn's cwd as sandbox sb's pod sees it: the workspace by
// default, a relative cwd below it, an absolute one as the pod sees it
// (a path below the workspace's host path is translated, for clients
// that name it). A cwd in the workspace is checked beneath it from the
// host for an early, clear error (as cwdFor does); any other is the
// pod's own, which the join's chdir inside the pod checks as the
// session's user (the host never opens it: the sandbox can change it).
func podCwd(sb registry.Sandbox, reqCwd string) (string, error) {
	if reqCwd == "" {
		return podWorkspace, nil
	}
	cwd := reqCwd
	if !filepath.IsAbs(cwd) {
		if cwd = filepath.Join(sb.Workspace, cwd); !inDir(sb.Workspace, cwd) {
			return "", apierr.Invalid("cwd %q leads out of the sandbox's workspace", reqCwd)
		}
	}
	cwd = filepath.Clean(cwd)
	if inDir(podWorkspace, cwd) && !inDir(sb.Workspace, cwd) {
		rel, _ := filepath.Rel(podWorkspace, cwd)
		cwd = filepath.Join(sb.Workspace, rel)
	}
	if !inDir(sb.Workspace, cwd) {
		return cwd, nil
	}
	d, err := sessiondir.OpenDirBeneath(sb.Workspace, cwd)
	if errors.Is(err, unix.EXDEV) {
		return "", apierr.Invalid("cwd %q resolves outside the sandbox's workspace (a symlink or .. in it leads out)", reqCwd)
	}
	if err != nil {
		return "", apierr.Invalid("cwd %q is not a directory", reqCwd)
	}
	d.Close()
	rel, _ := filepath.Rel(sb.Workspace, cwd)
	return filepath.Join(podWorkspace, rel), nil
}

// cwdFor resolves a spawn's cwd in sandbox sb: the directory, and the
// root it is confined to (sessiondir.Spec.DirRoot) when it lies in the
// workspace. A cwd in the workspace (relative, or absolute below it) is
// resolved beneath the workspace, never following a symlink out of it:
// a sandbox's command can replace any directory of its workspace with a
// symlink, and runnerd and the shim run as root. An isolated sandbox's
// cwd must lie in its workspace. Checked here as root, beneath the
// workspace, for an early and clear error; the shim resolves it again
// the same way at the start (as the sandbox's user, in the nsexec
// helper), which is the check that counts: the command may change its
// workspace in between.
func (s *Manager) cwdFor(sb registry.Sandbox, reqCwd string) (cwd, root string, err error) {
	cwd = sb.Workspace
	if reqCwd != "" {
		cwd = reqCwd
		if !filepath.IsAbs(cwd) {
			cwd = filepath.Join(sb.Workspace, cwd)
		}
	}
	cwd = filepath.Clean(cwd)
	if !inDir(sb.Workspace, cwd) {
		if s.sbx.Isolated(sb) {
			return "", "", apierr.Invalid("cwd %q is outside the sandbox's workspace %s: an isolated sandbox's commands start in their workspace or below it", reqCwd, sb.Workspace)
		}
		if fi, err := os.Stat(cwd); err != nil || !fi.IsDir() {
			return "", "", apierr.Invalid("cwd %q is not a directory", reqCwd)
		}
		return cwd, "", nil
	}
	d, err := sessiondir.OpenDirBeneath(sb.Workspace, cwd)
	if errors.Is(err, unix.EXDEV) {
		return "", "", apierr.Invalid("cwd %q resolves outside the sandbox's workspace (a symlink or .. in it leads out)", reqCwd)
	}
	if err != nil {
		return "", "", apierr.Invalid("cwd %q is not a directory", reqCwd)
	}
	d.Close() // O_PATH|O_DIRECTORY: it is one
	return cwd, sb.Workspace, nil
}

// inDir reports whether path (absolute, clean) is dir or lies below it.
func inDir(dir, path string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && (rel == "." || filepath.IsLocal(rel))
}

// Spawn starts a session in sandbox name and returns it once its command
// runs. created is false when req.ID named an existing session started by
// the same request (which is returned as it is now). It holds the
// sandbox's lock throughout, so a spawn never races a destroy or a
// suspend. The order:
//
//  1. normalize the request; lock the sandbox; read it;
//  2. with a warm shim idle and nothing to set up, prepare the session in
//     it (directory, journal, pipes) while step 3's fsync runs;
//  3. commit the record as starting (durable before the command runs);
//  4. set up the sandbox's network namespace if needed (netFor), build the
//     shim's spec (specFor) and start the shim (startShim), or start the
//     prepared one;
//  5. verify a contained command is in its namespace (else kill it);
//  6. answer, and record it running after the answer (recordRunning).
//
// A start that fails definitely removes the directory and the record; one
// that may still come up leaves both (startMayRun) and answers
// unavailable "uncertain".
func (s *Manager) Spawn(ctx context.Context, name string, req wire.CreateSession, opts SpawnOptions) (ss registry.Session, created bool, err error) {
	begun := time.Now()
	if err := normalize(&req); err != nil {
		return ss, false, err
	}
	if req.ID == "" {
		req.ID = registry.NewID()
	} else if err := ValidSessionID(req.ID); err != nil {
		return ss, false, err
	}
	// Locked first: the warm path below builds the command's spec (its
	// network namespace too) from live, and a policy change holds this
	// lock while it commits and sets up the namespace.
	unlock := s.sbx.Locks().Lock(name)
	defer unlock()
	live, err := s.sbx.Get(name)
	if err != nil {
		return ss, false, err
	}
	if err := s.spawnRoom(ctx, name, live, req.ID); err != nil {
		return ss, false, err
	}
	ss = registry.Session{
		Sandbox:     name,
		ID:          req.ID,
		Incarnation: live.Incarnation, // stored with the record: the session routes check it
		Key:         registry.NewID(),
		Request:     req,
		State:       StateStarting,
		StartedAt:   time.Now().UTC(),
	}
	pre, preNet := s.prepareWarm(live, ss, opts)
	s.adm.NameSession(ctx, name, ss.ID) // before the commit: capacity.go counts it once
	sb, cur, err := s.commitSpawn(ctx, ss, live, &pre)
	switch {
	case errors.Is(err, registry.ErrExists):
		if !sameRequest(cur.Request, req) {
			return ss, false, apierr.ConflictFor(wire.ReasonSessionExists, "%s: session %q exists with a different request", wire.DetailConflict, req.ID)
		}
		cur, err = s.Refresh(cur)
		if err == nil && cur.State == StateStarting {
			err = apierr.Uncertain("session %q is still starting; retry with the same id", req.ID)
		}
		return cur, false, err
	case err != nil:
		return ss, false, s.sbx.RegistryErr(err, name) // not_found for a sandbox gone meanwhile
	}

	s.bookAdd(cur) // sessions_cap.go: counted from now on
	if ss, err = s.startSpawned(ctx, ss, sb, pre, preNet, opts); err != nil {
		return ss, false, err
	}
	s.metrics.SessionStarted(time.Since(begun))
	s.log.Info("session started", "request_id", s.cfg.RequestID(ctx), "sandbox", name, "session", ss.ID, "pid", ss.PID, "tty", req.TTY)
	s.recordRunning(ss)
	s.watchExit(ss) // exitwatch.go: the manager records its exit, once
	return ss, true, nil
}

// spawnRoom refuses a new session id in sandbox name (live) when the sandbox's session
// cap or journal cap has no room for it; ended sessions' journals make
// room first (oldest first), as the ended-session bound does, running
// ones never. A re-create of an existing id is answered as before.
func (s *Manager) spawnRoom(ctx context.Context, name string, live registry.Sandbox, id string) error {
	if err := s.sessionCap(ctx, name, id); err != nil { // sessions_cap.go
		return err
	}
	if _, err := s.reg.GetSession(name, id); err != nil { // a re-create is answered as before
		if err := s.journalCap(live, nil); err != nil { // journalcap.go
			s.collectForJournal(ctx, live) // sessions_cap.go
			if err := s.journalCap(live, nil); err != nil {
				return err
			}
		}
	}
	return nil
}

// prepareWarm prepares ss in a warm shim when one is idle and live needs
// nothing set up: the shim makes the session's directory, journal and
// spec.json and opens the command's pipes while the record's fsync runs,
// and starts the command only after it (Prepared.Start): a record is
// durable before its command runs, and the spawn waits for the longer of
// the two, not both. Anything this cannot settle from the sandbox as read
// (a cwd to report, a network namespace to set up) gets nil, and the
// Spawn takes the cold path, in order.
func (s *Manager) prepareWarm(live registry.Sandbox, ss registry.Session, opts SpawnOptions) (*launch.Prepared, *netpolicy.Sandbox) {
	if s.cfg.Pool == nil || live.State == wire.SandboxSuspended {
		return nil, nil
	}
	nsb, ok := s.sbx.NetReady(live)
	if !ok {
		return nil, nil
	}
	var pref *sessiondir.PodRef
	if sandboxes.InPod(live) {
		if pref = s.sbx.PodReady(live); pref == nil {
			return nil, nil
		}
	}
	spec, err := s.specFor(live, ss, nsb, pref, opts)
	if err != nil {
		return nil, nil
	}
	pre, _ := s.cfg.Pool.Prepare(s.Dir(ss), spec)
	if pre == nil {
		return nil, nil
	}
	return pre, nsb
}

// commitSpawn commits ss as starting and returns the sandbox as
// committed with it. A prepared shim (*pre) that must not run is
// cancelled and *pre set to nil.
func (s *Manager) commitSpawn(ctx context.Context, ss registry.Session, live registry.Sandbox, pre **launch.Prepared) (sb registry.Sandbox, cur registry.Session, err error) {
	cur, err = s.reg.CreateSession(ss, func(rec registry.Sandbox) error {
		if err := sandboxes.CheckIncarnation(ctx, rec); err != nil {
			return err
		}
		if rec.State == wire.SandboxSuspended {
			return apierr.ConflictFor(wire.ReasonSandboxSuspended, "sandbox suspended")
		}
		if rec.Incarnation != ss.Incarnation {
			return apierr.Unavailable("sandbox %q was re-created during the spawn; retry", ss.Sandbox)
		}
		sb = rec
		return nil
	})
	if *pre != nil && (err != nil || !reflect.DeepEqual(sb.Network, live.Network)) {
		// Its directory is removed, its command never runs. A sandbox
		// whose network changed since live was read (the lock makes it
		// impossible; checked all the same, since a command outside its
		// policy is the one thing a spawn must never do) starts below,
		// from the committed record.
		(*pre).Cancel()
		*pre = nil
	}
	return sb, cur, err
}

// startSpawned starts the committed session ss of sandbox sb (the
// prepared shim pre, else a new one) and answers it running. A start
// that fails definitely removes the directory and the record; one that
// may still come up leaves both (startMayRun) and answers unavailable
// "uncertain".
func (s *Manager) startSpawned(ctx context.Context, ss registry.Session, sb registry.Sandbox, pre *launch.Prepared, preNet *netpolicy.Sandbox, opts SpawnOptions) (registry.Session, error) {
	name := ss.Sandbox
	fail := func(err error) (registry.Session, error) {
		os.RemoveAll(s.Dir(ss))
		if derr := s.reg.DeleteSession(name, ss.ID); derr != nil {
			s.log.Error("forget failed session", "sandbox", name, "session", ss.ID, "err", derr)
		} else {
			s.bookDrop(name, ss.ID)
		}
		return ss, err
	}
	// The shim outlives this request: a client that goes away must not
	// cancel a start half-way. Bound it instead.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ShimStartTimeout)
	defer cancel()
	var (
		st  sessiondir.Status
		nsb *netpolicy.Sandbox
		err error
	)
	if pre != nil {
		nsb = preNet
		st, err = pre.Start(sctx)
	} else {
		if nsb, err = s.sbx.NetFor(sctx, sb); err != nil {
			return fail(err)
		}
		var pref *sessiondir.PodRef
		if sandboxes.InPod(sb) {
			if pref, err = s.sbx.PodFor(sctx, sb); err != nil { // pods.go: adopted or made again
				return fail(err)
			}
		}
		var spec sessiondir.Spec
		if spec, err = s.specFor(sb, ss, nsb, pref, opts); err != nil {
			return fail(err)
		}
		st, err = s.startShim(sctx, s.Dir(ss), spec)
	}
	if err != nil && startMayRun(err) {
		// Not removed: the record (starting) and directory stay, so
		// refresh finds whatever comes up, and a retry of this id attaches
		// to it instead of starting a second process.
		s.log.Warn("session start uncertain", "sandbox", name, "session", ss.ID, "err", err)
		s.watchExit(ss) // settles it: running once its shim reports, else lost
		return ss, apierr.Uncertain("the session may be starting; retry with the same id: %v", err)
	}
	if err != nil {
		return fail(ClassifyStart(err))
	}
	if nsb != nil {
		// Advertise or refuse, never pretend: a contained sandbox's command
		// that is not in the namespace is killed, and the spawn fails.
		if verr := s.verifyNetNS(sctx, st.PID, nsb.NetNSPath, s.Dir(ss)); verr != nil {
			s.log.Error("session escaped its sandbox's network namespace; killing it", "sandbox", name, "session", ss.ID, "err", verr)
			if kerr := s.killUnverified(sctx, s.Dir(ss)); kerr != nil {
				// Not removed: the record (starting) and directory stay, so
				// the next refresh or restart finds what still runs.
				s.watchExit(ss)
				return ss, apierr.Uncertain("session %s is not contained (%v) and could not be stopped: %v", ss.ID, verr, kerr)
			}
			return fail(apierr.Unavailable("start session in the sandbox's network namespace: %v", verr))
		}
	}
	ss.State, ss.PID = wire.SessionRunning, st.PID
	if !st.StartedAt.IsZero() {
		ss.StartedAt = st.StartedAt.UTC()
	}
	return ss, nil
}

// recordRunning records a started session as running, after its answer
// rather than before: "starting" is durable already, so the
// acknowledgement need not wait for a second fsync. Only a record still
// starting, of this spawn, is changed.
func (s *Manager) recordRunning(ss registry.Session) {
	s.commits.commit(ss, "record session running", func(rec *registry.Session) {
		if rec.State == StateStarting {
			rec.State, rec.PID, rec.StartedAt = ss.State, ss.PID, ss.StartedAt
		}
	})
}

// startMayRun reports whether a failed shim start may still leave a shim,
// and so the command, running: the wait for its report ended (a context
// error), or no shim reported at all (a StartError with neither a shim
// pid nor a phase: it died, or garbled its line, at a point nobody
// knows). A reported StartError is definite (the shim removed what it
// created and exits), as is a failure before any shim was launched.
func startMayRun(err error) bool {
	var se *launch.StartError
	if errors.As(err, &se) {
		return se.ShimPID == 0 && se.Phase == ""
	}
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

// startShim starts the session's shim through a warm one when the pool
// has one idle, cold otherwise: the same readiness, errors and detachment.
func (s *Manager) startShim(ctx context.Context, dir string, spec sessiondir.Spec) (sessiondir.Status, error) {
	return s.cfg.Pool.Start(ctx, dir, spec)
}

// ClassifyStart maps a failure of launch.Pool.Start. Only a failure of the
// caller's command itself (the shim reports phase exec: no such
// executable, not executable, a bad cwd, an unknown run-as user) is the
// caller's mistake (invalid); a full disk is write_failed; anything else
// (a fork the host refused, a shim that crashed, a journal, socket or
// namespace that could not be set up) is transient (unavailable), even
// when its errno is ENOENT or EACCES.
//
// A missing executable (ENOENT) or one that cannot be run (EACCES,
// ENOEXEC, EISDIR) also carries wire.Error.ExecError, so that a client can answer
// as a shell does (127, 126) without reading the detail. The daemon
// checks the working directory before the start (specFor), so ENOENT in
// the exec phase is the executable's.
func ClassifyStart(err error) error {
	var se *launch.StartError
	switch {
	case errors.As(err, &se) && se.Phase == launch.PhaseExec:
		ae := apierr.Invalid("start command: %v", err)
		ae.ExecError = execErrorOf(se.Errno)
		return ae
	case errors.Is(err, sessiondir.ErrInvalid) && !errors.As(err, &se):
		return apierr.Invalid("start command: %v", err)
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return apierr.NoSpace("start session", err) // diskfull.go
	}
	return apierr.Unavailable("start session: %v", err)
}

// execErrorOf is the wire.ExecError of an exec-phase start failure's
// errno, or "" when it is neither a missing nor an unrunnable executable.
func execErrorOf(errno syscall.Errno) wire.ExecError {
	switch errno {
	case syscall.ENOENT:
		return wire.ExecErrorNotFound
	case syscall.EACCES, syscall.ENOEXEC, syscall.EISDIR:
		return wire.ExecErrorNotExecutable
	}
	return ""
}

// noNUL refuses a NUL byte in a command's argv, env or cwd: the kernel
// takes them as C strings, so a NUL would cut the entry where the caller
// did not mean it (and execve refuses it later, where it reads as a host
// failure). It is the caller's mistake: 400 invalid.
func noNUL(req *wire.CreateSession) error {
	for _, field := range [][]string{req.Argv, req.Env, {req.Cwd}} {
		for _, v := range field {
			if strings.IndexByte(v, 0) >= 0 {
				return apierr.Invalid("argv, env and cwd must not contain a NUL byte: %q", v)
			}
		}
	}
	return nil
}
