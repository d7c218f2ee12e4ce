package cgroup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/agentrunner/runner/cgroup/oom"
	"github.com/containerd/cgroups/v3/cgroup1"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// v1Controllers are the hierarchies a sandbox lives in under v1: memory,
// pids and cpu for the limits, cpuacct for CPU time (a separate mount on
// some hosts, this project's CI VM among them).
var v1Controllers = []cgroup1.Name{cgroup1.Memory, cgroup1.Pids, cgroup1.Cpu, cgroup1.Cpuacct}

// pather is what containerd's v1 subsystems implement to map a cgroup path
// to a directory (the interface itself is unexported there).
type pather interface {
	Path(path string) string
}

// v1 keeps sandboxes in the v1 hierarchies through containerd's cgroup1.
type v1 struct {
	mount string
	base  cgroup1.Path // Root in each hierarchy
	subs  []cgroup1.Subsystem
	memsw bool // memory.memsw.* exists (swap accounting on)
	// freezer says the freezer hierarchy is mounted and in subs: sandboxes
	// and their sessions are placed in it too, so Freeze can stop them.
	freezer bool
	avail   error
}

func newV1(cfg Config) (*v1, error) {
	b := &v1{mount: cfg.Mountpoint}
	if filepath.IsAbs(cfg.Root) {
		b.base = cgroup1.StaticPath(cfg.Root)
	} else {
		b.base = cgroup1.NestedPath(cfg.Root)
	}
	var missing []string
	for _, n := range v1Controllers {
		if _, err := os.Lstat(filepath.Join(cfg.Mountpoint, string(n))); err != nil {
			missing = append(missing, string(n))
			continue
		}
		switch n {
		case cgroup1.Memory:
			// kmem is gone from recent kernels and memsw depends on swap
			// accounting; neither is needed for Usage.
			b.subs = append(b.subs, cgroup1.NewMemory(cfg.Mountpoint, cgroup1.OptionalSwap(), cgroup1.IgnoreModules("kmem", "kmem.tcp")))
		case cgroup1.Pids:
			b.subs = append(b.subs, cgroup1.NewPids(cfg.Mountpoint))
		case cgroup1.Cpu:
			b.subs = append(b.subs, cgroup1.NewCpu(cfg.Mountpoint))
		case cgroup1.Cpuacct:
			b.subs = append(b.subs, cgroup1.NewCpuacct(cfg.Mountpoint))
		}
	}
	// The freezer is optional: without it everything but Freeze works.
	if _, err := os.Lstat(filepath.Join(cfg.Mountpoint, string(cgroup1.Freezer))); err == nil && len(b.subs) > 0 {
		b.subs = append(b.subs, cgroup1.NewFreezer(cfg.Mountpoint))
		b.freezer = true
	}
	if len(b.subs) == 0 {
		return nil, fmt.Errorf("find cgroup v1 controllers under %s: none of %v mounted: %w", cfg.Mountpoint, v1Controllers, ErrNotSupported)
	}
	if len(missing) > 0 {
		b.avail = fmt.Errorf("cgroup v1 controllers %v not mounted under %s: %w", missing, cfg.Mountpoint, ErrNotSupported)
	}
	_, err := os.Stat(filepath.Join(cfg.Mountpoint, "memory", "memory.memsw.limit_in_bytes"))
	b.memsw = err == nil
	// Create Root in each hierarchy now; New then checks that it is this
	// process's (checkOwned): a Root that was already there, made by
	// another runnerd, proves nothing by existing.
	dirs, err := b.dirs()
	if err != nil {
		return nil, err
	}
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil && b.avail == nil {
			b.avail = fmt.Errorf("create cgroup %s: %w: %w", d, err, ErrNotSupported)
		}
	}
	return b, nil
}

func (b *v1) available() error { return b.avail }

func (b *v1) hierarchy() ([]cgroup1.Subsystem, error) { return b.subs, nil }

// path is the cgroup path (relative to each hierarchy's root) of the
// elements below Root.
func (b *v1) path(elems ...string) cgroup1.Path {
	return func(n cgroup1.Name) (string, error) {
		p, err := b.base(n)
		if err != nil {
			return "", err
		}
		return filepath.Join(append([]string{p}, elems...)...), nil
	}
}

// dirs returns the directories of the elements below Root, one per
// hierarchy, a hierarchy reached twice (cpu and cpuacct co-mounted behind
// symlinks) once.
func (b *v1) dirs(elems ...string) ([]string, error) {
	p := b.path(elems...)
	seen := map[string]bool{}
	var dirs []string
	for _, s := range b.subs {
		rel, err := p(s.Name())
		if err != nil {
			return nil, fmt.Errorf("find %s cgroup: %w", s.Name(), err)
		}
		d := s.(pather).Path(rel)
		key := d
		if real, err := filepath.EvalSymlinks(filepath.Join(b.mount, string(s.Name()))); err == nil {
			key = filepath.Join(real, rel)
		}
		if seen[key] {
			continue
		}
		seen[key] = true
		dirs = append(dirs, d)
	}
	return dirs, nil
}

func (b *v1) rootDirs() []string {
	d, _ := b.dirs()
	return d
}

func (b *v1) exists(name string) (bool, error) {
	dirs, err := b.dirs(name)
	if err != nil {
		return false, err
	}
	_, err = os.Stat(dirs[0])
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

func (b *v1) ensure(name string, l Limits) error {
	quota, period := l.quotaPeriod()
	shares := l.shares()
	res := &specs.LinuxResources{CPU: &specs.LinuxCPU{Shares: &shares, Quota: &quota, Period: &period}}
	if l.Pids > 0 {
		res.Pids = &specs.LinuxPids{Limit: &l.Pids}
	}
	if b.avail != nil {
		res = &specs.LinuxResources{} // directories only: nothing to enforce with
	}
	cg, err := cgroup1.New(b.path(name), res, cgroup1.WithHierarchy(b.hierarchy))
	if err != nil {
		return err
	}
	if b.avail != nil {
		return nil
	}
	if l.Pids == 0 {
		// containerd writes pids.max only for a positive limit, so going
		// back to no limit is written here.
		if err := b.write(name, cgroup1.Pids, "pids.max", "max"); err != nil {
			return err
		}
	}
	return b.setMemory(cg, name, l.MemoryBytes)
}

// setMemory writes memory.limit_in_bytes, and memsw.limit_in_bytes to
// the same value so the sandbox cannot spill into swap. The kernel wants
// limit <= memsw after every write, so a rising limit writes memsw first
// and a falling one the limit first. containerd's Update means to order
// them but swaps the wrong pair (limit with soft_limit, v3.1.3), so each
// value goes through its own Update here.
func (b *v1) setMemory(cg cgroup1.Cgroup, name string, limit int64) error {
	if limit == 0 {
		limit = -1 // no limit
	}
	memsw := func() error {
		if !b.memsw {
			return nil
		}
		return cg.Update(&specs.LinuxResources{Memory: &specs.LinuxMemory{Swap: &limit}})
	}
	mem := func() error {
		return cg.Update(&specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &limit}})
	}
	rising := limit < 0
	if !rising {
		cur, err := b.read(name, cgroup1.Memory, "memory.limit_in_bytes")
		if err != nil {
			return err
		}
		n, err := strconv.ParseUint(cur, 10, 64)
		if err != nil {
			return fmt.Errorf("parse memory.limit_in_bytes %q: %w", cur, err)
		}
		rising = uint64(limit) > n
	}
	if rising {
		if err := memsw(); err != nil {
			return err
		}
		return mem()
	}
	if err := mem(); err != nil {
		return err
	}
	return memsw()
}

// held reads back the limits of name's cgroup (see held).
func (b *v1) held(name string) (held, error) {
	var h held
	v, err := b.read(name, cgroup1.Memory, "memory.limit_in_bytes")
	if err == nil {
		h.memory, err = parseMemory(v)
	}
	if err == nil && b.memsw {
		var sw string
		if sw, err = b.read(name, cgroup1.Memory, "memory.memsw.limit_in_bytes"); err == nil {
			var n int64
			if n, err = parseMemory(sw); err == nil && n != h.memory {
				err = fmt.Errorf("memory.memsw.limit_in_bytes %q differs from memory.limit_in_bytes %q", sw, v)
			}
		}
	}
	if err == nil {
		if v, err = b.read(name, cgroup1.Pids, "pids.max"); err == nil {
			h.pids, err = parseMax(v)
		}
	}
	if err == nil {
		if v, err = b.read(name, cgroup1.Cpu, "cpu.cfs_quota_us"); err == nil {
			h.quotaUS, err = strconv.ParseInt(v, 10, 64)
		}
	}
	return h, err
}

func (b *v1) file(name string, n cgroup1.Name, file string) (string, error) {
	rel, err := b.path(name)(n)
	if err != nil {
		return "", err
	}
	return filepath.Join(b.mount, string(n), rel, file), nil
}

func (b *v1) read(name string, n cgroup1.Name, file string) (string, error) {
	p, err := b.file(name, n, file)
	if err != nil {
		return "", err
	}
	data, err := os.ReadFile(p)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(data)), nil
}

func (b *v1) write(name string, n cgroup1.Name, file, value string) error {
	p, err := b.file(name, n, file)
	if err != nil {
		return err
	}
	if err := os.WriteFile(p, []byte(value), 0); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	return nil
}

func (b *v1) usage(name string) (Usage, error) {
	cg, err := cgroup1.Load(b.path(name), cgroup1.WithHierarchy(b.hierarchy))
	if errors.Is(err, cgroup1.ErrCgroupDeleted) {
		return Usage{}, ErrNotFound
	}
	if err != nil {
		return Usage{}, err
	}
	st, err := cg.Stat()
	if err != nil {
		return Usage{}, err
	}
	var u Usage
	if st.Memory != nil && st.Memory.Usage != nil {
		u.MemoryBytes, u.MemoryPeakBytes = st.Memory.Usage.Usage, st.Memory.Usage.Max
	}
	if st.CPU != nil && st.CPU.Usage != nil {
		u.CPUTime = time.Duration(st.CPU.Usage.Total)
	}
	if st.Pids != nil {
		u.Pids = st.Pids.Current
	}
	if st.MemoryOomControl != nil {
		u.OOMKills = st.MemoryOomControl.OomKill
	}
	// v1 counts an OOM kill only in the victim's own memory cgroup (v2
	// also counts it in every ancestor), so the sessions' leaves are
	// added: the total covers the leaves that still exist.
	memDir, err := b.file(name, cgroup1.Memory, "")
	if err != nil {
		return Usage{}, err
	}
	leaves, err := listDirs(memDir)
	if err != nil {
		return Usage{}, err
	}
	for _, leaf := range leaves {
		n, err := oom.ReadKey(filepath.Join(memDir, leaf, "memory.oom_control"), "oom_kill")
		if errors.Is(err, os.ErrNotExist) {
			continue // removed meanwhile
		}
		if err != nil {
			return Usage{}, err
		}
		u.OOMKills += n
	}
	return u, nil
}

func (b *v1) sessionDirs(name, session string) ([]string, error) {
	if _, err := cgroup1.New(b.path(name, session), &specs.LinuxResources{}, cgroup1.WithHierarchy(b.hierarchy)); err != nil {
		return nil, err
	}
	return b.dirs(name, session)
}

func (b *v1) removeSession(ctx context.Context, name, session string) error {
	return b.removeTree(ctx, name, session)
}

func (b *v1) remove(ctx context.Context, name string) error {
	return b.removeTree(ctx, name)
}

// removeTree kills every process in the cgroup at elems (in any of the
// hierarchies: a process half placed counts) and removes it with its
// children.
func (b *v1) removeTree(ctx context.Context, elems ...string) error {
	dirs, err := b.dirs(elems...)
	if err != nil {
		return err
	}
	member, err := b.member(elems...)
	if err != nil {
		return err
	}
	procs := func() ([]int, error) {
		seen := map[int]bool{}
		var pids []int
		for _, d := range dirs {
			if err := walkProcs(d, func(pid int) {
				if !seen[pid] {
					seen[pid] = true
					pids = append(pids, pid)
				}
			}); err != nil {
				return nil, err
			}
		}
		sort.Ints(pids)
		return pids, nil
	}
	if err := killAll(ctx, procs, member); err != nil {
		return err
	}
	for _, d := range dirs {
		if err := rmdirTree(d); err != nil {
			return err
		}
	}
	return nil
}

// member reports whether a process is, in any of the hierarchies, in the
// cgroup at elems or below it.
func (b *v1) member(elems ...string) (func(pid int) bool, error) {
	rels := map[cgroup1.Name]string{}
	for _, s := range b.subs {
		rel, err := b.path(elems...)(s.Name())
		if err != nil {
			return nil, err
		}
		rels[s.Name()] = rel
	}
	return func(pid int) bool {
		for n, rel := range rels {
			if p, ok := procCgroup(pid, string(n)); ok && under(p, rel) {
				return true
			}
		}
		return false
	}, nil
}

func (b *v1) list() ([]string, error) {
	dirs, err := b.dirs()
	if err != nil {
		return nil, err
	}
	// Every hierarchy holds the same names; the first (memory) answers.
	return listDirs(dirs[0])
}
