package cgroup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/containerd/cgroups/v3"
)

// Mode is the cgroup layout a Manager drives.
type Mode int

const (
	// ModeAuto detects the layout: v2 where /sys/fs/cgroup is cgroup2,
	// else v1 (the legacy and the hybrid layouts, whose controllers are
	// all v1).
	ModeAuto Mode = iota
	// ModeV1 uses the v1 memory, pids, cpu and cpuacct hierarchies.
	ModeV1
	// ModeV2 uses the unified hierarchy.
	ModeV2
)

func (m Mode) String() string {
	switch m {
	case ModeAuto:
		return "auto"
	case ModeV1:
		return "v1"
	case ModeV2:
		return "v2"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// DefaultRoot is Config.Root's default: a "runner" cgroup beside runnerd's
// own process, inside runnerd's own cgroup in each hierarchy.
const DefaultRoot = "runner"

// Config says where a Manager keeps sandboxes' cgroups.
type Config struct {
	// Mode forces a layout; ModeAuto (the zero value) detects it.
	Mode Mode
	// Mountpoint is where the cgroup filesystems are mounted: under v1 the
	// directory holding one mount per controller, under v2 the cgroup2
	// mount. Empty means /sys/fs/cgroup, or /sys/fs/cgroup/unified for
	// ModeV2 on a hybrid host.
	Mountpoint string
	// Root is the cgroup under which sandboxes go. A relative path is
	// taken inside the calling process's own cgroup in each hierarchy (read
	// from /proc/self/cgroup): under systemd with Delegate=yes that is the
	// only subtree runnerd may write. An absolute path is taken from each
	// hierarchy's root. Empty means DefaultRoot.
	Root string
	// DaemonLeaf is, under v2 with a relative Root, the child of the
	// caller's own cgroup that the caller moves itself into when that is
	// what it takes to enable controllers for Root: v2 lets a cgroup give
	// controllers to its children only while it holds no process itself.
	// Empty means "runnerd".
	DaemonLeaf string
}

// backend is one layout's implementation; names are validated by Manager.
type backend interface {
	available() error
	ensure(name string, l Limits) error
	exists(name string) (bool, error)
	usage(name string) (Usage, error)
	sessionDirs(name, session string) ([]string, error)
	removeSession(ctx context.Context, name, session string) error
	remove(ctx context.Context, name string) error
	list() ([]string, error)
	// held reads back what the kernel holds of a cgroup's limits.
	held(name string) (held, error)
	// rootDirs are Root's directories, one per hierarchy.
	rootDirs() []string
}

// Manager creates, limits, measures and removes sandboxes' cgroups. It is
// safe for concurrent use; it holds no state beyond its configuration, so
// every answer comes from the cgroup filesystem and survives a restart.
type Manager struct {
	mode Mode
	b    backend
}

// New returns a Manager for cfg. It creates Root when missing (and never
// removes anything). It fails only when no cgroup filesystem is found or
// cfg is malformed; a host that has one but cannot enforce limits (not
// root, read-only, a controller missing) gets a Manager whose Available
// says why. A Root that exists but is not the caller's (owned by another
// uid, or not writable: see owner.go) gets a Manager that touches nothing
// under it: every method fails with Available's error.
func New(cfg Config) (*Manager, error) {
	if cfg.Root == "" {
		cfg.Root = DefaultRoot
	}
	if cfg.DaemonLeaf == "" {
		cfg.DaemonLeaf = "runnerd"
	}
	if err := validName(cfg.DaemonLeaf); err != nil {
		return nil, fmt.Errorf("daemon leaf: %w", err)
	}
	if cleaned := cleanRoot(cfg.Root); cleaned == "" {
		return nil, fmt.Errorf("root %q: not a cgroup path: %w", cfg.Root, ErrInvalid)
	} else {
		cfg.Root = cleaned
	}
	mode := cfg.Mode
	if mode == ModeAuto {
		switch cgroups.Mode() {
		case cgroups.Unified:
			mode = ModeV2
		case cgroups.Legacy, cgroups.Hybrid:
			mode = ModeV1
		default:
			return nil, fmt.Errorf("detect cgroups: no cgroup filesystem at /sys/fs/cgroup: %w", ErrNotSupported)
		}
	}
	var (
		b   backend
		err error
	)
	switch mode {
	case ModeV1:
		if cfg.Mountpoint == "" {
			cfg.Mountpoint = "/sys/fs/cgroup"
		}
		b, err = newV1(cfg)
	case ModeV2:
		if cfg.Mountpoint == "" {
			cfg.Mountpoint = "/sys/fs/cgroup"
			if cgroups.Mode() == cgroups.Hybrid {
				cfg.Mountpoint = "/sys/fs/cgroup/unified"
			}
		}
		b, err = newV2(cfg)
	default:
		return nil, fmt.Errorf("mode %v: %w", mode, ErrInvalid)
	}
	if err != nil {
		return nil, err
	}
	if err := checkOwned(b.rootDirs()); err != nil {
		b = foreign{err: err, dirs: b.rootDirs()}
	}
	return &Manager{mode: mode, b: b}, nil
}

// cleanRoot returns root without "." or ".." elements or duplicate
// slashes, keeping a leading slash; "" when nothing is left or when ".."
// would climb.
func cleanRoot(root string) string {
	abs := strings.HasPrefix(root, "/")
	var parts []string
	for _, p := range strings.Split(root, "/") {
		switch p {
		case "", ".":
			continue
		case "..":
			return ""
		}
		if strings.ContainsRune(p, 0) {
			return ""
		}
		parts = append(parts, p)
	}
	if len(parts) == 0 {
		return ""
	}
	s := strings.Join(parts, "/")
	if abs {
		s = "/" + s
	}
	return s
}

// Mode is the layout in use (never ModeAuto).
func (m *Manager) Mode() Mode { return m.mode }

// Available returns nil when limits can be enforced and usage read here,
// else an error wrapping ErrNotSupported that says why. The daemon
// advertises resource_limits only when it is nil.
func (m *Manager) Available() error { return m.b.available() }

// Ensure creates the sandbox's cgroup if missing and applies l (a zero
// field resets that limit to none). Calling it again with the same l
// changes nothing. It returns ErrInvalid for a bad name or l, and
// ErrNotSupported for a non-zero l where Available is not nil. A zero l
// creates the cgroup even then, where the hierarchy is writable, so
// sessions can still be placed, killed and removed as a group.
func (m *Manager) Ensure(name string, l Limits) error {
	if err := m.check(name, l); err != nil {
		return err
	}
	if err := m.b.ensure(name, l); err != nil {
		return fmt.Errorf("ensure cgroup %s: %w", name, err)
	}
	return m.verify(name, l)
}

// verify reads back what the kernel holds of name's limits and fails
// unless it is l: a write the kernel rounded, clamped or dropped is never
// reported as done. Nothing to compare where limits are not enforced.
func (m *Manager) verify(name string, l Limits) error {
	if m.b.available() != nil {
		return nil
	}
	h, err := m.b.held(name)
	if err != nil {
		return fmt.Errorf("read back limits of cgroup %s: %w", name, err)
	}
	if err := checkHeld(h, l.want()); err != nil {
		return fmt.Errorf("limit cgroup %s: %v: %w", name, err, ErrNotHeld)
	}
	return nil
}

// Update applies l to an existing sandbox cgroup: ErrNotFound when it does
// not exist, otherwise as Ensure. Lowering memory below what the sandbox
// uses makes the kernel reclaim first and fails (EBUSY) if it cannot.
func (m *Manager) Update(name string, l Limits) error {
	if err := m.check(name, l); err != nil {
		return err
	}
	if err := m.mustExist(name); err != nil {
		return fmt.Errorf("update cgroup %s: %w", name, err)
	}
	if err := m.b.ensure(name, l); err != nil {
		return fmt.Errorf("update cgroup %s: %w", name, err)
	}
	return m.verify(name, l)
}

func (m *Manager) check(name string, l Limits) error {
	if err := validName(name); err != nil {
		return err
	}
	if err := l.Validate(); err != nil {
		return err
	}
	if !l.Zero() {
		if err := m.b.available(); err != nil {
			return fmt.Errorf("limit sandbox %s: %w", name, err)
		}
	}
	return nil
}

func (m *Manager) mustExist(name string) error {
	ok, err := m.b.exists(name)
	if err != nil {
		return err
	}
	if !ok {
		return ErrNotFound
	}
	return nil
}

// Usage reads what the sandbox has consumed: ErrNotFound when its cgroup
// does not exist, ErrNotSupported where Available is not nil.
func (m *Manager) Usage(name string) (Usage, error) {
	if err := validName(name); err != nil {
		return Usage{}, err
	}
	if err := m.b.available(); err != nil {
		return Usage{}, fmt.Errorf("read usage of %s: %w", name, err)
	}
	if err := m.mustExist(name); err != nil {
		return Usage{}, fmt.Errorf("read usage of %s: %w", name, err)
	}
	u, err := m.b.usage(name)
	if err != nil {
		return Usage{}, fmt.Errorf("read usage of %s: %w", name, err)
	}
	return u, nil
}

// SessionDirs creates the session's leaf under an existing sandbox cgroup
// (ErrNotFound otherwise) and returns its directories, for
// sessiondir.Spec.Cgroups: one under v2, one per hierarchy under v1 (memory,
// pids, cpu, cpuacct; a hierarchy mounted with another, such as
// cpu,cpuacct, appears once). The command's pid written to cgroup.procs
// of each is the whole placement.
func (m *Manager) SessionDirs(name, session string) ([]string, error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	if err := validName(session); err != nil {
		return nil, err
	}
	if err := m.mustExist(name); err != nil {
		return nil, fmt.Errorf("create session cgroup %s/%s: %w", name, session, err)
	}
	dirs, err := m.b.sessionDirs(name, session)
	if err != nil {
		return nil, fmt.Errorf("create session cgroup %s/%s: %w", name, session, err)
	}
	return dirs, nil
}

// RemoveSession kills whatever still runs in the session's leaf and
// removes it. Absent is success. ctx bounds the wait for the processes
// to die.
func (m *Manager) RemoveSession(ctx context.Context, name, session string) error {
	if err := validName(name); err != nil {
		return err
	}
	if err := validName(session); err != nil {
		return err
	}
	if err := m.b.removeSession(ctx, name, session); err != nil {
		return fmt.Errorf("remove session cgroup %s/%s: %w", name, session, err)
	}
	return nil
}

// Remove kills whatever still runs in the sandbox's cgroup (the daemon
// stops its sessions first; this is the backstop), waits until it is
// empty, and removes its leaves and itself. Absent is success. ctx bounds
// the wait; on expiry the error wraps ctx.Err() and the cgroup stays.
func (m *Manager) Remove(ctx context.Context, name string) error {
	if err := validName(name); err != nil {
		return err
	}
	if err := m.b.remove(ctx, name); err != nil {
		return fmt.Errorf("remove cgroup %s: %w", name, err)
	}
	return nil
}

// List returns the names of the sandbox cgroups under Root, for
// reconciliation with the registry after a restart.
func (m *Manager) List() ([]string, error) {
	names, err := m.b.list()
	if err != nil {
		return nil, fmt.Errorf("list cgroups: %w", err)
	}
	return names, nil
}

// validName accepts one plain path element: a sandbox or session name
// that could climb out of Root ("..", "a/../../x") or name nothing is
// ErrInvalid.
func validName(name string) error {
	switch {
	case name == "" || name == "." || name == "..":
		return fmt.Errorf("cgroup name %q: %w", name, ErrInvalid)
	case len(name) > 255:
		return fmt.Errorf("cgroup name of %d bytes: longer than 255: %w", len(name), ErrInvalid)
	case strings.ContainsAny(name, "/\x00\n"):
		return fmt.Errorf("cgroup name %q: not one path element: %w", name, ErrInvalid)
	}
	return nil
}

// listDirs returns the names of dir's subdirectories.
func listDirs(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if e.IsDir() {
			names = append(names, e.Name())
		}
	}
	return names, nil
}
