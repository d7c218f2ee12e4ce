package storage

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
)

// ErrNotSupported is returned when the pool's driver cannot do what is
// asked: a limit it would not hold (any limit on "dir", inodes on
// "btrfs"), or an operation it has no native form of (snapshots on
// "ext4" and "dir"). Nothing is changed.
var ErrNotSupported = errors.New("storage: not supported by this driver")

// ErrInvalid is returned for a bad name, a negative limit, a Grow that
// would shrink a limit, or a Create of an existing volume with other
// limits. Nothing is changed.
var ErrInvalid = errors.New("storage: invalid argument")

// ErrNotFound is returned when the named volume or snapshot has no
// record in the pool.
var ErrNotFound = errors.New("storage: not found")

// ErrExists is returned by Snapshot and Clone when the new name is taken.
var ErrExists = errors.New("storage: already exists")

// ErrClosed is returned by every method called after Close.
var ErrClosed = errors.New("storage: pool closed")

// Driver names.
const (
	Btrfs = "btrfs"
	Ext4  = "ext4"
	Dir   = "dir"
)

// Limits is a volume's budget. Zero means no limit.
type Limits struct {
	Bytes  int64 `json:"bytes,omitempty"`
	Inodes int64 `json:"inodes,omitempty"`
}

// Usage is what a volume holds now.
type Usage struct {
	Bytes int64
	// Inodes is -1 where the driver does not count them (btrfs).
	Inodes int64
}

// Volume is a volume as the kernel holds it.
type Volume struct {
	Name string
	// Path is where the volume is mounted (a directory owned by root,
	// mode 0755: the caller chowns it for the sandbox).
	Path string
	// Limits are the limits the kernel holds: at most what was asked
	// for bytes; for inodes on ext4, the count mkfs made, which may be a
	// little more than asked.
	Limits Limits
}

// Config configures a pool.
type Config struct {
	// Dir is the pool's directory under runnerd's state; made 0700.
	Dir string
	// Driver is Btrfs, Ext4 or Dir; empty means [DefaultDriver].
	Driver string
	// Size is the btrfs pool file's size in bytes, made sparse
	// (default 16 GiB, at least 128 MiB). Open with a larger size than
	// the pool has grows it, mounted; a smaller one leaves it as it is.
	// The other drivers ignore it.
	Size int64
}

// DefaultPoolSize is the btrfs pool file's size when Config.Size is 0.
const DefaultPoolSize = 16 << 30

// Pool is an opened storage pool. It is safe for concurrent use; its
// operations run one at a time. The caller must Close it; volumes stay
// mounted after Close, for the next Open to adopt.
type Pool struct {
	dir string
	drv driver

	mu     sync.Mutex // serialises operations; guards closed
	closed bool
}

// driver is the seam a storage driver implements. The Pool checks names
// and limits, keeps the records and serialises calls; a driver method
// may assume its arguments valid.
type driver interface {
	name() string
	// check refuses limits the driver would not hold.
	check(l Limits) error
	// budgets reports whether the driver holds a byte limit.
	budgets() bool
	// open makes or adopts the driver's pool in dir.
	open(ctx context.Context) error
	// list names the driver's volumes and snapshots that exist now.
	list() (vols, snaps []string, err error)
	// create makes volume name, which does not exist, with limits.
	create(ctx context.Context, name string, l Limits) (Limits, error)
	// ensure mounts volume name if it is not, and returns its held limits.
	ensure(ctx context.Context, name string, l Limits) (Limits, error)
	// grow raises name's limits from old to l (l ≥ old, checked).
	grow(ctx context.Context, name string, old, l Limits) (Limits, error)
	usage(ctx context.Context, name string) (Usage, error)
	snapshot(ctx context.Context, name, snap string) error
	clone(ctx context.Context, snap, name string, l Limits) (Limits, error)
	// remove deletes volume name and everything it holds; absent is success.
	remove(ctx context.Context, name string) error
	removeSnapshot(ctx context.Context, snap string) error
	path(name string) string
	// destroy removes the driver's pool (every volume is gone already).
	destroy(ctx context.Context) error
}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

func checkName(name string) error {
	if !nameRE.MatchString(name) || strings.Contains(name, "..") {
		return fmt.Errorf("%w: name %q (want [a-z0-9][a-z0-9_.-]{0,62}, no \"..\")", ErrInvalid, name)
	}
	return nil
}

func checkLimits(l Limits) error {
	if l.Bytes < 0 || l.Inodes < 0 {
		return fmt.Errorf("%w: negative limit %+v", ErrInvalid, l)
	}
	return nil
}

// Open opens the pool in cfg.Dir with cfg.Driver, making it the first
// time, and adopts what an earlier runnerd left: mounted volumes are
// used as they are, others are mounted, and every interrupted Create or
// Delete is finished by removing the volume. A directory made with one
// driver is refused by another ([ErrInvalid]).
func Open(ctx context.Context, cfg Config) (*Pool, error) {
	if cfg.Dir == "" || !filepath.IsAbs(cfg.Dir) {
		return nil, fmt.Errorf("%w: pool directory %q is not absolute", ErrInvalid, cfg.Dir)
	}
	if cfg.Driver == "" {
		cfg.Driver, _ = DefaultDriver()
	}
	if cfg.Size == 0 {
		cfg.Size = DefaultPoolSize
	}
	if cfg.Size < 0 {
		return nil, fmt.Errorf("%w: pool size %d", ErrInvalid, cfg.Size)
	}
	switch cfg.Driver {
	case Btrfs:
		if cfg.Size < btrfsMinSize {
			return nil, fmt.Errorf("%w: a btrfs pool needs at least %d bytes (asked for %d)", ErrInvalid, int64(btrfsMinSize), cfg.Size)
		}
	case Ext4, Dir:
	default:
		return nil, fmt.Errorf("%w: driver %q (btrfs, ext4 or dir)", ErrInvalid, cfg.Driver)
	}
	dir := filepath.Clean(cfg.Dir)
	for _, d := range []string{dir, filepath.Join(dir, "records")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("make pool directory: %w", err)
		}
	}
	// The kernel names mounts and loop devices' files by their real
	// paths; adoption compares with those.
	dir, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, fmt.Errorf("resolve pool directory: %w", err)
	}
	var drv driver
	switch cfg.Driver {
	case Btrfs:
		drv = &btrfsDriver{dir: dir, size: cfg.Size}
	case Ext4:
		drv = &ext4Driver{dir: dir}
	case Dir:
		drv = &dirDriver{dir: dir}
	}
	if err := claimDriver(dir, drv.name()); err != nil {
		return nil, err
	}
	if err := drv.open(ctx); err != nil {
		return nil, fmt.Errorf("open %s pool %s: %w", drv.name(), dir, err)
	}
	p := &Pool{dir: dir, drv: drv}
	if err := p.converge(ctx); err != nil {
		return nil, fmt.Errorf("adopt %s pool %s: %w", drv.name(), dir, err)
	}
	return p, nil
}

// claimDriver records the driver a pool directory was made with, and
// refuses another.
func claimDriver(dir, name string) error {
	f := filepath.Join(dir, "driver")
	b, err := os.ReadFile(f)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return writeFileSync(f, []byte(name+"\n"))
	case err != nil:
		return fmt.Errorf("read pool driver: %w", err)
	case strings.TrimSpace(string(b)) != name:
		return fmt.Errorf("%w: pool %s was made by driver %q, not %q", ErrInvalid, dir, strings.TrimSpace(string(b)), name)
	}
	return nil
}

// converge finishes what a crash interrupted (see the package doc) and
// mounts every ready volume.
func (p *Pool) converge(ctx context.Context) error {
	vols, snaps, err := p.drv.list()
	if err != nil {
		return err
	}
	for _, v := range vols {
		r, err := p.readRecord("vol", v)
		if errors.Is(err, ErrNotFound) || (err == nil && r.State != stateReady) {
			if err := p.drv.remove(ctx, v); err != nil {
				return fmt.Errorf("remove half-made volume %s: %w", v, err)
			}
			if err := p.removeRecord("vol", v); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		if _, err := p.drv.ensure(ctx, v, r.Limits); err != nil {
			return fmt.Errorf("mount volume %s: %w", v, err)
		}
	}
	for _, s := range snaps {
		r, err := p.readRecord("snap", s)
		if errors.Is(err, ErrNotFound) || (err == nil && r.State != stateReady) {
			if err := p.drv.removeSnapshot(ctx, s); err != nil {
				return fmt.Errorf("remove half-made snapshot %s: %w", s, err)
			}
			if err := p.removeRecord("snap", s); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
	}
	// Records whose volume is gone: a Create that wrote its record and
	// crashed before the driver made anything, or a ready volume someone
	// removed by hand (its record would lie).
	ents, err := os.ReadDir(filepath.Join(p.dir, "records"))
	if err != nil {
		return fmt.Errorf("list records: %w", err)
	}
	for _, e := range ents {
		kind, name, ok := strings.Cut(strings.TrimSuffix(e.Name(), ".json"), "-")
		if !ok || !strings.HasSuffix(e.Name(), ".json") {
			os.Remove(filepath.Join(p.dir, "records", e.Name())) // a temporary file of a torn write
			continue
		}
		have := vols
		if kind == "snap" {
			have = snaps
		}
		if !contains(have, name) {
			if err := p.removeRecord(kind, name); err != nil {
				return err
			}
		}
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Driver is the pool's driver name.
func (p *Pool) Driver() string { return p.drv.name() }

// Budgets reports whether the pool holds byte limits (false for "dir":
// runnerd says at start that disk budgets are off).
func (p *Pool) Budgets() bool { return p.drv.budgets() }

// Path is where volume name is mounted (whether or not it exists).
func (p *Pool) Path(name string) string { return p.drv.path(name) }

func (p *Pool) lock() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return ErrClosed
	}
	return nil
}

// lockFor checks a volume's name and limits (the driver's say included)
// before anything is touched, then takes the pool's lock: the caller
// unlocks p.mu when it returns nil.
func (p *Pool) lockFor(name string, l Limits) error {
	if err := checkName(name); err != nil {
		return err
	}
	if err := checkLimits(l); err != nil {
		return err
	}
	if err := p.drv.check(l); err != nil {
		return err
	}
	return p.lock()
}

// Create returns volume name, making it with limits l if it does not
// exist (get-or-create). An existing volume with other limits is
// [ErrInvalid]; a limit the driver would not hold is [ErrNotSupported].
// A Create cut short by a crash is undone by the next Open, or by the
// next Create of the same name.
func (p *Pool) Create(ctx context.Context, name string, l Limits) (Volume, error) {
	if err := p.lockFor(name, l); err != nil {
		return Volume{}, err
	}
	defer p.mu.Unlock()
	r, err := p.readRecord("vol", name)
	switch {
	case err == nil && r.State == stateReady:
		if r.Limits != l {
			return Volume{}, fmt.Errorf("%w: volume %s exists with limits %+v, not %+v", ErrInvalid, name, r.Limits, l)
		}
		held, err := p.drv.ensure(ctx, name, r.Limits)
		if err != nil {
			return Volume{}, fmt.Errorf("mount volume %s: %w", name, err)
		}
		return Volume{Name: name, Path: p.drv.path(name), Limits: held}, nil
	case err == nil: // a half-made volume: remove it, then make it anew
		if err := p.drv.remove(ctx, name); err != nil {
			return Volume{}, fmt.Errorf("remove half-made volume %s: %w", name, err)
		}
	case !errors.Is(err, ErrNotFound):
		return Volume{}, err
	}
	if err := p.writeRecord("vol", name, record{State: stateCreating, Limits: l}); err != nil {
		return Volume{}, err
	}
	held, err := p.drv.create(ctx, name, l)
	if err != nil {
		err = fmt.Errorf("create volume %s: %w", name, err)
		if rerr := p.drv.remove(ctx, name); rerr != nil {
			return Volume{}, errors.Join(err, fmt.Errorf("remove half-made volume: %w", rerr))
		}
		return Volume{}, errors.Join(err, p.removeRecord("vol", name))
	}
	if err := p.writeRecord("vol", name, record{State: stateReady, Limits: l}); err != nil {
		return Volume{}, err
	}
	return Volume{Name: name, Path: p.drv.path(name), Limits: held}, nil
}

// grows reports whether limit b is at least a (0 is no limit).
func grows(a, b int64) bool { return b == 0 || (a != 0 && b >= a) }

// Grow raises volume name's limits to l. A lower limit than the current
// one (a limit where there was none included) is [ErrInvalid]; the
// volume is unchanged.
func (p *Pool) Grow(ctx context.Context, name string, l Limits) (Volume, error) {
	if err := p.lockFor(name, l); err != nil {
		return Volume{}, err
	}
	defer p.mu.Unlock()
	r, err := p.readReady("vol", name)
	if err != nil {
		return Volume{}, err
	}
	if !grows(r.Limits.Bytes, l.Bytes) || !grows(r.Limits.Inodes, l.Inodes) {
		return Volume{}, fmt.Errorf("%w: volume %s: limits %+v to %+v would shrink (grow only)", ErrInvalid, name, r.Limits, l)
	}
	held, err := p.drv.grow(ctx, name, r.Limits, l)
	if err != nil {
		return Volume{}, fmt.Errorf("grow volume %s: %w", name, err)
	}
	r.Limits = l
	if err := p.writeRecord("vol", name, r); err != nil {
		return Volume{}, err
	}
	return Volume{Name: name, Path: p.drv.path(name), Limits: held}, nil
}

// Usage returns what volume name holds now.
func (p *Pool) Usage(ctx context.Context, name string) (Usage, error) {
	if err := checkName(name); err != nil {
		return Usage{}, err
	}
	if err := p.lock(); err != nil {
		return Usage{}, err
	}
	defer p.mu.Unlock()
	if _, err := p.readReady("vol", name); err != nil {
		return Usage{}, err
	}
	u, err := p.drv.usage(ctx, name)
	if err != nil {
		return Usage{}, fmt.Errorf("read usage of volume %s: %w", name, err)
	}
	return u, nil
}

// Snapshot takes a read-only snapshot snap of volume name, where the
// driver has them ([ErrNotSupported] otherwise). The caller makes the
// volume consistent first (freeze the sandbox's cgroup, syncfs).
func (p *Pool) Snapshot(ctx context.Context, name, snap string) error {
	if err := checkName(name); err != nil {
		return err
	}
	if err := checkName(snap); err != nil {
		return err
	}
	if err := p.lock(); err != nil {
		return err
	}
	defer p.mu.Unlock()
	r, err := p.readReady("vol", name)
	if err != nil {
		return err
	}
	if _, err := p.readRecord("snap", snap); err == nil {
		return fmt.Errorf("%w: snapshot %s", ErrExists, snap)
	}
	if err := p.writeRecord("snap", snap, record{State: stateCreating, Limits: r.Limits, From: name}); err != nil {
		return err
	}
	if err := p.drv.snapshot(ctx, name, snap); err != nil {
		err = fmt.Errorf("snapshot volume %s: %w", name, err)
		return errors.Join(err, p.drv.removeSnapshot(ctx, snap), p.removeRecord("snap", snap))
	}
	return p.writeRecord("snap", snap, record{State: stateReady, Limits: r.Limits, From: name})
}

// Clone makes volume name, writable, from snapshot snap, with the
// limits of the volume the snapshot was taken of. The two share every
// block until one is written, and never see each other's writes.
func (p *Pool) Clone(ctx context.Context, snap, name string) (Volume, error) {
	if err := checkName(name); err != nil {
		return Volume{}, err
	}
	if err := checkName(snap); err != nil {
		return Volume{}, err
	}
	if err := p.lock(); err != nil {
		return Volume{}, err
	}
	defer p.mu.Unlock()
	s, err := p.readReady("snap", snap)
	if err != nil {
		return Volume{}, err
	}
	if _, err := p.readRecord("vol", name); err == nil {
		return Volume{}, fmt.Errorf("%w: volume %s", ErrExists, name)
	}
	if err := p.writeRecord("vol", name, record{State: stateCreating, Limits: s.Limits}); err != nil {
		return Volume{}, err
	}
	held, err := p.drv.clone(ctx, snap, name, s.Limits)
	if err != nil {
		err = fmt.Errorf("clone snapshot %s: %w", snap, err)
		return Volume{}, errors.Join(err, p.drv.remove(ctx, name), p.removeRecord("vol", name))
	}
	if err := p.writeRecord("vol", name, record{State: stateReady, Limits: s.Limits}); err != nil {
		return Volume{}, err
	}
	return Volume{Name: name, Path: p.drv.path(name), Limits: held}, nil
}

// DeleteSnapshot removes snapshot snap; absent is success.
func (p *Pool) DeleteSnapshot(ctx context.Context, snap string) error {
	if err := checkName(snap); err != nil {
		return err
	}
	if err := p.lock(); err != nil {
		return err
	}
	defer p.mu.Unlock()
	if err := p.removeRecord("snap", snap); err != nil {
		return err
	}
	if err := p.drv.removeSnapshot(ctx, snap); err != nil {
		return fmt.Errorf("delete snapshot %s: %w", snap, err)
	}
	return nil
}

// Delete removes volume name and frees everything it held: its mount,
// its loop device, its files. Absent is success. The record goes first,
// so a Delete cut short is finished by the next Open.
func (p *Pool) Delete(ctx context.Context, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	if err := p.lock(); err != nil {
		return err
	}
	defer p.mu.Unlock()
	if err := p.removeRecord("vol", name); err != nil {
		return err
	}
	if err := p.drv.remove(ctx, name); err != nil {
		return fmt.Errorf("delete volume %s: %w", name, err)
	}
	return nil
}

// Close ends the use of p. Volumes stay mounted for the next Open.
// Close is idempotent.
func (p *Pool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	return nil
}

// Destroy deletes every volume and snapshot, unmounts the pool, frees
// its loop devices and removes its directory; then p is closed.
func (p *Pool) Destroy(ctx context.Context) error {
	if err := p.lock(); err != nil {
		return err
	}
	defer p.mu.Unlock()
	vols, snaps, err := p.drv.list()
	if err != nil {
		return err
	}
	for _, s := range snaps {
		if err := p.drv.removeSnapshot(ctx, s); err != nil {
			return fmt.Errorf("delete snapshot %s: %w", s, err)
		}
	}
	for _, v := range vols {
		if err := p.drv.remove(ctx, v); err != nil {
			return fmt.Errorf("delete volume %s: %w", v, err)
		}
	}
	if err := p.drv.destroy(ctx); err != nil {
		return fmt.Errorf("destroy pool: %w", err)
	}
	p.closed = true
	if err := os.RemoveAll(p.dir); err != nil {
		return fmt.Errorf("remove pool directory: %w", err)
	}
	return nil
}
