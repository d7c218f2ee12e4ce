package sessiondir

import (
	"bytes"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/agentrunner/runner/shim/internal/proto"
	"golang.org/x/sys/unix"
)

// Files of a session directory.
const (
	SpecFile    = "spec.json"    // what to run (Spec), written by Start
	SocketFile  = "ctl.sock"     // the shim's control socket, removed when the shim exits
	PIDFile     = "shim.pid"     // the shim's pid, one decimal line
	StartedFile = "started.json" // shim pid, command pid, start time; written before ready
	LogFile     = "shim.log"     // the shim's own stderr (panics, diagnostics)
	JournalDir  = "journal"      // the session's journal (package journal)
)

// maxSocketPath is the longest usable sun_path on Linux (108 bytes with the
// terminating NUL).
const maxSocketPath = 107

// Session states, as in Status.State.
const (
	StateRunning = "running"
	StateExited  = "exited"
	StateLost    = "lost"
)

// Spec is what a session runs. It is stored as spec.json in the session
// directory.
type Spec struct {
	ID string `json:"id"`
	// Sandbox names the session's sandbox, for the shim's process title
	// (title.go) only; empty leaves it out.
	Sandbox string   `json:"sandbox,omitempty"`
	Argv    []string `json:"argv"` // no shell unless the caller asks for one
	// Env is the complete environment of the command. PATH in it (or a
	// default) is used to find Argv[0] when it has no slash.
	Env []string `json:"env"`
	Dir string   `json:"cwd"`
	// DirRoot optionally confines Dir (then required: DirRoot or below
	// it, both absolute): Dir is resolved beneath DirRoot and never
	// leaves it, whatever symlinks lie below it (a start whose Dir would
	// fails in the exec phase with EXDEV; see beneath.go). Only DirRoot
	// itself is opened as a path, by the shim (as root: the directories
	// above it need not let User pass); the rest is resolved as User. The
	// caller vouches that nobody but root can change DirRoot or what lies
	// above it (runnerd: the sandbox's workspace). Without DirRoot, Dir is
	// the command's own chdir(2), as User.
	DirRoot string `json:"cwd_root,omitempty"`
	// User optionally runs the command as another user: a name, or
	// uid[:gid]. A name sets the user's primary group and supplementary
	// groups; uid[:gid] sets no supplementary groups (gid defaults to the
	// uid's primary group, or the uid).
	User string `json:"user,omitempty"`
	TTY  bool   `json:"tty"`
	Rows uint16 `json:"rows,omitempty"` // initial PTY size; 0 means 24
	Cols uint16 `json:"cols,omitempty"` // initial PTY size; 0 means 80
	// NetNS optionally names a network namespace file (e.g.
	// /var/run/netns/NAME). The shim locks an OS thread, setns(2)s it into
	// the namespace, forks the command from that thread (a child inherits
	// its forking thread's namespaces), then restores the thread; if it
	// cannot restore it, the thread is discarded, never reused.
	NetNS string `json:"netns,omitempty"`
	// ResolvConf optionally names a file (an absolute path) that the
	// command sees as /etc/resolv.conf: the command then runs in its own
	// mount namespace, where the file is bind-mounted read-only over
	// /etc/resolv.conf (over the file it resolves to, when that is a
	// symlink). The shim's and the host's mount tables are never changed.
	// The shim prepares the namespace in a re-executed helper that then
	// execs the command, so the command's pid is still the one reported
	// (see nsexec.go); a failure fails the start.
	ResolvConf string `json:"resolv_conf,omitempty"`
	// Binds optionally lists directories the command sees at other paths
	// (runnerd's private /tmp, /var/tmp and /dev/shm of a sandbox, as
	// systemd's PrivateTmp= does): the command then runs in its own mount
	// namespace, where each Source (absolute: an existing directory, or
	// a file over a file) is bind-mounted nosuid and nodev (and read-only
	// with ReadOnly) over its Target (absolute, existing),
	// in order, before the user switch (an unprivileged user cannot
	// mount). Every Source is opened before the first mount, so a Source
	// under an earlier Target is still the host's. A failure fails the
	// start. The shim's and the host's mount tables are never changed.
	Binds []Bind `json:"binds,omitempty"`
	// Hostname optionally runs the command in a UTS namespace of its own
	// with this host name (runnerd: the sandbox's name), so it neither
	// sees nor can set the host's. At most 64 bytes of [A-Za-z0-9.-].
	Hostname string `json:"hostname,omitempty"`
	// Isolate runs the command with no way back up: PR_SET_NO_NEW_PRIVS,
	// a capability bounding set of CAP_NET_RAW alone (exec.go, step 5)
	// and empty ambient and inheritable sets, so a setuid binary or one with file capabilities gains
	// nothing. It needs a User that is not root (root without
	// capabilities still owns root's files): an Isolate spec whose User is
	// empty or resolves to uid 0 is refused with ErrInvalid. The steps run
	// in the nsexec helper (exec.go).
	Isolate bool `json:"isolate,omitempty"`
	// Seccomp optionally carries the compiled system-call filter of an
	// Isolate or Pod spec (seccomp.Filter.MarshalBinary), compiled once by
	// the launcher (launch.Pool does, once per process) so that no shim
	// compiles it: the nsexec helper checks it (seccomp.Decode: length,
	// version, architecture, checksum) and installs it as it came, and
	// refuses the start if it is not intact. Empty: the shim compiles the
	// profile itself, once per shim process. Unused by any other spec.
	Seccomp []byte `json:"seccomp,omitempty"`
	// Cgroups optionally names the cgroup directories (absolute, clean,
	// existing) the command is placed in before it executes anything:
	// with cgroup v2 one directory of the unified hierarchy (the command
	// is cloned into it, CLONE_INTO_CGROUP); with cgroup v1 or a hybrid
	// layout one directory per controller hierarchy (the nsexec helper
	// writes its pid into each cgroup.procs before it execs the
	// command), plus at most one v2 directory. The shim itself is never in
	// them, and a directory that holds the shim is refused (ErrInvalid):
	// the shim must survive the command's OOM and must not count against
	// its pids limit. Creating and removing them is the caller's.
	Cgroups []string `json:"cgroups,omitempty"`
	// Pod optionally starts the command inside a pod (package pod) made
	// by its holder PID, whose start time must still be StartTime: the
	// nsexec helper joins the holder's user, mount, pid, ipc, uts, cgroup
	// and network namespaces (shim/pod.go), so the command sees the pod's
	// root, processes and host name, and runs as User inside it: "uid" or
	// "uid:gid" of the pod's user namespace (names are the pod's /etc's,
	// which the shim does not read), root (0:0) when empty. Dir is a path
	// inside the pod. Nothing is made per spawn: NetNS, ResolvConf, Binds,
	// Hostname, DirRoot and Isolate are the pod's business and refused
	// with it; the command always runs under the seccomp filter with
	// no_new_privs, its capabilities (root's) those of the pod's user
	// namespace only. Cgroups still place it.
	Pod *PodRef `json:"pod,omitempty"`
	// RetainBytes caps each stream's journal (0 keeps everything).
	RetainBytes int64 `json:"retain_bytes,omitempty"`
	// JournalBudget optionally names a file (absolute, 8 bytes, made by
	// the caller) holding the bytes the journals of every session of the
	// sandbox hold, shared by their shims (budget.go), and JournalCap the
	// most it may reach: output past it is not stored, and the session is
	// ended (exit detail names the cap). Both or neither.
	JournalBudget string `json:"journal_budget,omitempty"`
	JournalCap    int64  `json:"journal_cap,omitempty"`
	// StdinClosed starts the command with its stdin at EOF: the shim
	// closes its end as soon as the command runs, as close-stdin would,
	// sparing a caller with nothing to send that round trip (runnerd's
	// exec). Not with TTY.
	StdinClosed bool `json:"stdin_closed,omitempty"`
	// HoldTask optionally names a Sprites Tasks API socket (an absolute
	// path, /.sprite/api.sock in a sprite): while the command runs the
	// shim holds a task there, so the sprite does not pause under a
	// detached session (hold.go). Off when empty.
	HoldTask string `json:"hold_task,omitempty"`
	// MergeStderr gives the command one pipe as stdout and stderr, so
	// the stdout stream holds both in the order they were written and
	// the stderr stream stays empty. Not with TTY.
	MergeStderr bool `json:"merge_stderr,omitempty"`
}

// validHostname accepts "" (none) and what sethostname(2) and a
// resolver take: at most 64 bytes of letters, digits, '.' and '-'.
func validHostname(h string) bool {
	if len(h) > 64 {
		return false
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// Bind is one bind mount of Spec.Binds: a directory over a directory,
// or a file over a file (runnerd's /etc/passwd of an isolated sandbox).
type Bind struct {
	Source string `json:"source"`
	Target string `json:"target"`
	// ReadOnly mounts it read-only besides nosuid and nodev.
	ReadOnly bool `json:"read_only,omitempty"`
}

// Streams returns the journal streams of a session with this spec.
func (s Spec) Streams() []string {
	if s.TTY {
		return []string{"stdout"}
	}
	return []string{"stdout", "stderr"}
}

func (s Spec) Validate() error {
	if !ValidID(s.ID) {
		return fmt.Errorf("%w: id %q (want 1-64 of [A-Za-z0-9._-], starting with a letter or digit)", ErrInvalid, s.ID)
	}
	if len(s.Argv) == 0 || s.Argv[0] == "" {
		return fmt.Errorf("%w: empty argv", ErrInvalid)
	}
	if s.HoldTask != "" && !filepath.IsAbs(s.HoldTask) {
		return fmt.Errorf("%w: hold_task %q is not an absolute path", ErrInvalid, s.HoldTask)
	}
	if !validHostname(s.Hostname) {
		return fmt.Errorf("%w: hostname %q (want at most 64 of [A-Za-z0-9.-])", ErrInvalid, s.Hostname)
	}
	for _, b := range s.Binds {
		if !filepath.IsAbs(b.Source) || !filepath.IsAbs(b.Target) {
			return fmt.Errorf("%w: bind %q over %q: not absolute paths", ErrInvalid, b.Source, b.Target)
		}
	}
	if _, ok := RelBelow(s.DirRoot, s.Dir); s.DirRoot != "" && !ok {
		return fmt.Errorf("%w: cwd %q is not cwd_root %q or below it (absolute paths)", ErrInvalid, s.Dir, s.DirRoot)
	}
	if s.ResolvConf != "" && !filepath.IsAbs(s.ResolvConf) {
		return fmt.Errorf("%w: resolv_conf %q is not an absolute path", ErrInvalid, s.ResolvConf)
	}
	if s.Isolate {
		if s.User == "" {
			return fmt.Errorf("%w: isolate needs a user that is not root, and none is set", ErrInvalid)
		}
		// A lookup failure is the start's to report (PhaseExec), as
		// without Isolate; a user that is root is refused here.
		if c, err := Credential(s.User); err == nil && c.Uid == 0 {
			return fmt.Errorf("%w: isolate: user %q is uid 0, which owns root's files even without capabilities", ErrInvalid, s.User)
		}
	}
	v2 := 0
	hierarchies := map[uint64]string{} // device of each hierarchy (one superblock each) → the dir in it
	for _, dir := range s.Cgroups {
		if !filepath.IsAbs(dir) || filepath.Clean(dir) != dir {
			return fmt.Errorf("%w: cgroup %q is not an absolute clean path", ErrInvalid, dir)
		}
		isV2, err := CgroupKind(dir)
		if err != nil {
			return err
		}
		if isV2 {
			if v2++; v2 > 1 {
				return fmt.Errorf("%w: more than one cgroup v2 directory", ErrInvalid)
			}
		}
		var st unix.Stat_t
		if err := unix.Stat(dir, &st); err != nil {
			return fmt.Errorf("%w: cgroup %q: %w", ErrInvalid, dir, err)
		}
		if other, ok := hierarchies[st.Dev]; ok {
			return fmt.Errorf("%w: cgroups %q and %q are in one hierarchy (a process is in one directory of each)", ErrInvalid, other, dir)
		}
		hierarchies[st.Dev] = dir
		// The shim starts in its launcher's cgroups (and checks again for
		// itself before the command starts).
		if err := NotOurs(dir); err != nil {
			return err
		}
	}
	if s.Pod != nil {
		if s.Pod.PID <= 0 {
			return fmt.Errorf("%w: pod pid %d", ErrInvalid, s.Pod.PID)
		}
		if s.NetNS != "" || s.ResolvConf != "" || len(s.Binds) > 0 || s.Hostname != "" || s.DirRoot != "" || s.Isolate {
			return fmt.Errorf("%w: pod with netns, resolv_conf, binds, hostname, cwd_root or isolate (the pod has its own)", ErrInvalid)
		}
		if _, _, err := PodUser(s.User); err != nil {
			return err
		}
	}
	if s.RetainBytes < 0 {
		return fmt.Errorf("%w: negative retain_bytes", ErrInvalid)
	}
	if (s.JournalBudget == "") != (s.JournalCap == 0) || s.JournalCap < 0 || (s.JournalBudget != "" && !filepath.IsAbs(s.JournalBudget)) {
		return fmt.Errorf("%w: journal_budget (an absolute path) and journal_cap (positive) go together", ErrInvalid)
	}
	if s.StdinClosed && s.TTY {
		return fmt.Errorf("%w: stdin_closed with a tty", ErrInvalid)
	}
	if s.MergeStderr && s.TTY {
		return fmt.Errorf("%w: merge_stderr with a tty", ErrInvalid)
	}
	return nil
}

// PodRef names a pod's holder: its pid and start time (clock ticks since
// boot, /proc/PID/stat field 22), which together name one process.
type PodRef struct {
	PID       int    `json:"pid"`
	StartTime uint64 `json:"start_time"`
}

// PodUser parses a Spec.User for a pod: "", "uid" or "uid:gid", ids of
// the pod's user namespace (below 65536: the ids a pod maps). Empty is
// root; a uid alone has the gid of the same number.
func PodUser(user string) (uid, gid uint32, err error) {
	if user == "" {
		return 0, 0, nil
	}
	u, g, hasG := strings.Cut(user, ":")
	parse := func(s string) (uint32, bool) {
		n, err := strconv.ParseUint(s, 10, 32)
		return uint32(n), err == nil && n < 65536
	}
	ui, ok := parse(u)
	gi := ui
	if ok && hasG {
		gi, ok = parse(g)
	}
	if !ok {
		return 0, 0, fmt.Errorf("%w: user %q in a pod: want uid or uid:gid below 65536", ErrInvalid, user)
	}
	return ui, gi, nil
}

// ValidID reports whether id is a usable session id: 1-64 bytes of
// [A-Za-z0-9._-], the first a letter or a digit (runnerd's rule too, so an
// id never reads as an option, a hidden file or a staging directory).
func ValidID(id string) bool {
	if len(id) == 0 || len(id) > 64 || !isAlnum(id[0]) {
		return false
	}
	for _, c := range []byte(id) {
		if !isAlnum(c) && c != '.' && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// DefaultPath is the PATH a command gets when its environment names none,
// and the one the shim looks its program up in then (runnerd puts it into
// the spec's environment, so both sides agree).
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Credential resolves Spec.User: a name, or uid[:gid].
func Credential(spec string) (*syscall.Credential, error) {
	name, gidStr, hasGid := strings.Cut(spec, ":")
	if uid, err := strconv.ParseUint(name, 10, 32); err == nil {
		c := &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid), Groups: []uint32{}}
		if u, err := user.LookupId(name); err == nil {
			if g, err := strconv.ParseUint(u.Gid, 10, 32); err == nil {
				c.Gid = uint32(g)
			}
		}
		if hasGid {
			g, err := strconv.ParseUint(gidStr, 10, 32)
			if err != nil {
				return nil, fmt.Errorf("%w: user %q: bad gid", ErrInvalid, spec)
			}
			c.Gid = uint32(g)
		}
		return c, nil
	}
	if hasGid {
		return nil, fmt.Errorf("%w: user %q: a name takes no :gid", ErrInvalid, spec)
	}
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("look up user %q: %w", name, err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("look up user %q: non-numeric ids", name)
	}
	c := &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}
	if gids, err := u.GroupIds(); err == nil {
		for _, g := range gids {
			if n, err := strconv.ParseUint(g, 10, 32); err == nil {
				c.Groups = append(c.Groups, uint32(n))
			}
		}
	}
	return c, nil
}

// CgroupKind reports whether dir is a cgroup v2 directory (else v1), or
// an ErrInvalid error when it is not a cgroup directory at all.
func CgroupKind(dir string) (v2 bool, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return false, fmt.Errorf("%w: cgroup %q: %w", ErrInvalid, dir, proto.UnwrapPath(err))
	}
	switch st.Type {
	case unix.CGROUP2_SUPER_MAGIC:
		return true, nil
	case unix.CGROUP_SUPER_MAGIC:
		return false, nil
	}
	return false, fmt.Errorf("%w: cgroup %q is not on a cgroup file system", ErrInvalid, dir)
}

// NotOurs refuses a cgroup the shim itself is in: the command's OOM or
// pids limit would then reach the shim.
func NotOurs(dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return fmt.Errorf("read cgroup %s: %w", dir, err)
	}
	me := []byte(strconv.Itoa(os.Getpid()))
	for _, l := range bytes.Split(b, []byte("\n")) {
		if bytes.Equal(l, me) {
			return fmt.Errorf("%w: cgroup %q holds the shim itself", ErrInvalid, dir)
		}
	}
	return nil
}

// NeedsHelper reports whether spec's command takes the nsexec helper
// (what the supervisor's exec plan decides, without the command): a step
// only the helper can do is active. It must agree with the plan
// (TestSpecNeedsHelperAgrees holds it): a cgroup that is not v2 counts,
// one that cannot be read does not.
func (spec Spec) NeedsHelper() bool {
	if spec.ResolvConf != "" || len(spec.Binds) > 0 || spec.Hostname != "" || spec.Isolate || spec.Pod != nil {
		return true
	}
	for _, dir := range spec.Cgroups {
		if v2, err := CgroupKind(dir); err == nil && !v2 {
			return true
		}
	}
	return false
}
