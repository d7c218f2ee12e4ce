package cgroup

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/cgroups/v3/cgroup2"
	"golang.org/x/sys/unix"
)

// v2Controllers are the controllers a sandbox's limits need.
var v2Controllers = []string{"memory", "pids", "cpu"}

// v2 keeps sandboxes in the unified hierarchy through containerd's cgroup2.
type v2 struct {
	mount string
	root  string // Root as a cgroup path from the hierarchy's root ("/runner")
	swap  bool   // memory.swap.max exists (swap accounting on)
	avail error
}

func newV2(cfg Config) (*v2, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(cfg.Mountpoint, &st); err != nil {
		return nil, fmt.Errorf("find cgroup2 at %s: %w: %w", cfg.Mountpoint, err, ErrNotSupported)
	}
	if st.Type != unix.CGROUP2_SUPER_MAGIC {
		return nil, fmt.Errorf("find cgroup2 at %s: not a cgroup2 mount: %w", cfg.Mountpoint, ErrNotSupported)
	}
	b := &v2{mount: cfg.Mountpoint, root: cfg.Root}
	var own string
	if !filepath.IsAbs(cfg.Root) {
		var err error
		if own, err = cgroup2.NestedGroupPath(""); err != nil {
			return nil, fmt.Errorf("read own cgroup: %w", err)
		}
		b.root = path.Join(own, cfg.Root)
	}
	if err := os.MkdirAll(b.dir(), 0o755); err != nil {
		b.avail = fmt.Errorf("create cgroup %s: %w: %w", b.dir(), err, ErrNotSupported)
		return b, nil
	}
	if b.avail = checkOwned(b.rootDirs()); b.avail != nil {
		return b, nil // another's: enable nothing in it, move nothing
	}
	b.avail = b.enableControllers(own, cfg.DaemonLeaf)
	if b.avail == nil {
		_, err := os.Stat(filepath.Join(b.dir(), "memory.swap.max"))
		b.swap = err == nil
	}
	return b, nil
}

func (b *v2) dir(elems ...string) string {
	return filepath.Join(append([]string{b.mount, b.root}, elems...)...)
}

func (b *v2) group(elems ...string) string {
	return path.Join(append([]string{b.root}, elems...)...)
}

func (b *v2) rootDirs() []string { return []string{b.dir()} }

// enableControllers makes memory, pids and cpu available to Root's
// children, or says why it cannot. It only asks for controllers that
// Root's parent has (cgroup.controllers): on a hybrid host, where they are
// all bound to v1, it writes nothing. When the parent is the caller's own
// cgroup and still holds the caller (v2 refuses controllers to the
// children of a cgroup with processes: EBUSY), the caller first moves
// itself into the leaf daemonLeaf, as a systemd Delegate=yes service must.
func (b *v2) enableControllers(own, daemonLeaf string) error {
	parent := filepath.Dir(b.dir())
	have, err := readFields(filepath.Join(parent, "cgroup.controllers"))
	if err != nil {
		return fmt.Errorf("read controllers of %s: %w: %w", parent, err, ErrNotSupported)
	}
	var missing []string
	for _, c := range v2Controllers {
		if !slices.Contains(have, c) {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("cgroup v2 controllers %v not available in %s (cgroup.controllers %q): %w", missing, parent, have, ErrNotSupported)
	}
	m, err := cgroup2.Load(b.root, cgroup2.WithMountpoint(b.mount))
	if err != nil {
		return fmt.Errorf("load cgroup %s: %w: %w", b.root, err, ErrNotSupported)
	}
	err = m.ToggleControllers(v2Controllers, cgroup2.Enable)
	if errors.Is(err, unix.EBUSY) && own != "" && own != "/" && filepath.Dir(b.root) == own {
		leaf := filepath.Join(b.mount, own, daemonLeaf)
		if err := os.MkdirAll(leaf, 0o755); err != nil {
			return fmt.Errorf("create daemon leaf %s: %w: %w", leaf, err, ErrNotSupported)
		}
		if err := os.WriteFile(filepath.Join(leaf, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
			return fmt.Errorf("move self into %s: %w: %w", leaf, err, ErrNotSupported)
		}
		err = m.ToggleControllers(v2Controllers, cgroup2.Enable)
	}
	if err != nil {
		return fmt.Errorf("enable controllers %v for %s: %w: %w", v2Controllers, b.root, err, ErrNotSupported)
	}
	return nil
}

func (b *v2) available() error { return b.avail }

func (b *v2) resources(l Limits) *cgroup2.Resources {
	if b.avail != nil {
		return &cgroup2.Resources{} // directories only: nothing to enforce with
	}
	mem := int64(math.MaxInt64) // the kernel clamps it: "max"
	if l.MemoryBytes > 0 {
		mem = l.MemoryBytes
	}
	memory := &cgroup2.Memory{Max: &mem}
	if b.swap {
		// No swap beyond the memory limit (v2 counts swap separately):
		// none for a limited sandbox, no limit for an unlimited one.
		swap := int64(0)
		if l.MemoryBytes == 0 {
			swap = math.MaxInt64
		}
		memory.Swap = &swap
	}
	pids := int64(-1) // "max"
	if l.Pids > 0 {
		pids = l.Pids
	}
	weight := l.weight()
	quota, period := l.quotaPeriod()
	var q *int64
	if quota > 0 {
		q = &quota
	}
	return &cgroup2.Resources{
		Memory: memory,
		Pids:   &cgroup2.Pids{Max: pids},
		CPU:    &cgroup2.CPU{Weight: &weight, Max: cgroup2.NewCPUMax(q, &period)},
	}
}

func (b *v2) ensure(name string, l Limits) error {
	_, err := cgroup2.NewManager(b.mount, b.group(name), b.resources(l))
	return err
}

// held reads back the limits of name's cgroup (see held).
func (b *v2) held(name string) (held, error) {
	var h held
	read := func(file string, parse func(string) (int64, error), into *int64) error {
		raw, err := os.ReadFile(filepath.Join(b.dir(name), file))
		if err != nil {
			return err
		}
		*into, err = parse(strings.TrimSpace(string(raw)))
		return err
	}
	if err := read("memory.max", parseMemory, &h.memory); err != nil {
		return h, err
	}
	if err := read("pids.max", parseMax, &h.pids); err != nil {
		return h, err
	}
	return h, read("cpu.max", parseCPUMax, &h.quotaUS)
}

func (b *v2) exists(name string) (bool, error) {
	_, err := os.Stat(b.dir(name))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

func (b *v2) usage(name string) (Usage, error) {
	m, err := cgroup2.Load(b.group(name), cgroup2.WithMountpoint(b.mount))
	if err != nil {
		return Usage{}, err
	}
	st, err := m.StatFiltered(cgroup2.StatPids | cgroup2.StatCPU | cgroup2.StatMemory | cgroup2.StatMemoryEvents)
	if err != nil {
		return Usage{}, err
	}
	var u Usage
	if st.Memory != nil {
		u.MemoryBytes, u.MemoryPeakBytes = st.Memory.Usage, st.Memory.MaxUsage
	}
	if st.CPU != nil {
		u.CPUTime = time.Duration(st.CPU.UsageUsec) * time.Microsecond
	}
	if st.Pids != nil {
		u.Pids = st.Pids.Current
	}
	if st.MemoryEvents != nil {
		u.OOMKills = st.MemoryEvents.OomKill // hierarchical: every leaf's kills
	}
	return u, nil
}

func (b *v2) sessionDirs(name, session string) ([]string, error) {
	m, err := cgroup2.Load(b.group(name), cgroup2.WithMountpoint(b.mount))
	if err != nil {
		return nil, err
	}
	var res *cgroup2.Resources
	if b.avail == nil {
		// The memory controller on the leaf gives it its own
		// memory.events, which is how a session's OOM kills are told
		// apart from its siblings'.
		res = &cgroup2.Resources{Memory: &cgroup2.Memory{}}
	}
	if _, err := m.NewChild(session, res); err != nil {
		return nil, err
	}
	return []string{b.dir(name, session)}, nil
}

func (b *v2) removeSession(ctx context.Context, name, session string) error {
	return b.removeTree(ctx, name, session)
}

func (b *v2) remove(ctx context.Context, name string) error {
	return b.removeTree(ctx, name)
}

// removeTree kills everything in the cgroup at elems with cgroup.kill
// (which also takes its children, and processes forked meanwhile), waits
// until the procs of it and its children are empty, and removes it.
func (b *v2) removeTree(ctx context.Context, elems ...string) error {
	dir := b.dir(elems...)
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	m, err := cgroup2.Load(b.group(elems...), cgroup2.WithMountpoint(b.mount))
	if err != nil {
		return err
	}
	if err := m.Kill(); err != nil {
		return fmt.Errorf("kill %s: %w", dir, err)
	}
	group := b.group(elems...)
	procs := func() ([]int, error) {
		var pids []int
		err := walkProcs(dir, func(pid int) { pids = append(pids, pid) })
		return pids, err
	}
	member := func(pid int) bool {
		p, ok := procCgroup(pid, "")
		return ok && under(p, group)
	}
	// cgroup.kill already signalled everything; the loop waits for the
	// deaths and catches anything cgroup.kill's fallback (kernels before
	// 5.14) missed.
	if err := killAll(ctx, procs, member); err != nil {
		return err
	}
	return rmdirTree(dir)
}

func (b *v2) list() ([]string, error) { return listDirs(b.dir()) }

// readFields returns the space-separated words of a one-line file.
func readFields(p string) ([]string, error) {
	data, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(data)), nil
}
