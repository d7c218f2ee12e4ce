package storage

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// cloner is a driver whose clones can be prepared before anyone sees
// them (btrfs).
type cloner interface {
	// cloneAs clones snap as volume name with limits l: made where no
	// sandbox reaches it, given to prepare, checked against l, and only
	// then moved to name's path.
	cloneAs(ctx context.Context, snap, name string, l Limits, prepare func(root string) error) (Limits, error)
}

// CloneAs makes volume name, writable, from snapshot snap, with limits l
// (not the snapshot's: a fork has a budget of its own), where the driver
// has snapshots ([ErrNotSupported] otherwise). Before the clone appears at
// its path (Path(name)) it lies in the pool's private directory (root's,
// 0700), where prepare (nil: none) gets its root: the clone holds another
// sandbox's files, owned by that sandbox's uid, and only there can root
// give them to their new owner with no process of the old one able to
// reach in. A clone that holds more bytes than l.Bytes, once prepared, is
// refused with an error wrapping unix.EDQUOT; a failed CloneAs leaves no
// volume. A CloneAs cut short by a crash is undone by the next Open.
func (p *Pool) CloneAs(ctx context.Context, snap, name string, l Limits, prepare func(root string) error) (Volume, error) {
	if err := checkName(snap); err != nil {
		return Volume{}, err
	}
	if err := p.lockFor(name, l); err != nil {
		return Volume{}, err
	}
	defer p.mu.Unlock()
	cl, ok := p.drv.(cloner)
	if !ok {
		return Volume{}, fmt.Errorf("%w: the %s driver has no snapshots to clone", ErrNotSupported, p.drv.name())
	}
	if _, err := p.readReady("snap", snap); err != nil {
		return Volume{}, err
	}
	if _, err := p.readRecord("vol", name); err == nil {
		return Volume{}, fmt.Errorf("%w: volume %s", ErrExists, name)
	}
	if err := p.writeRecord("vol", name, record{State: stateCreating, Limits: l}); err != nil {
		return Volume{}, err
	}
	held, err := cl.cloneAs(ctx, snap, name, l, prepare)
	if err != nil {
		err = fmt.Errorf("clone snapshot %s: %w", snap, err)
		return Volume{}, errors.Join(err, p.drv.remove(ctx, name), p.removeRecord("vol", name))
	}
	if err := p.writeRecord("vol", name, record{State: stateReady, Limits: l}); err != nil {
		return Volume{}, err
	}
	return Volume{Name: name, Path: p.drv.path(name), Limits: held}, nil
}

// Snapshots names the pool's snapshots, in name order (every one a
// record lists, ready or not).
func (p *Pool) Snapshots() ([]string, error) {
	if err := p.lock(); err != nil {
		return nil, err
	}
	defer p.mu.Unlock()
	ents, err := os.ReadDir(filepath.Join(p.dir, "records"))
	if err != nil {
		return nil, fmt.Errorf("list records: %w", err)
	}
	var out []string
	for _, e := range ents {
		if name, ok := strings.CutPrefix(strings.TrimSuffix(e.Name(), ".json"), "snap-"); ok && strings.HasSuffix(e.Name(), ".json") {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out, nil
}

// staging is where btrfs clones are prepared: inside the snapshots
// directory (root's, 0700), under a name no snapshot takes (nameRE: no
// leading dot), so list never names it.
func (d *btrfsDriver) staging(name string) string {
	return filepath.Join(d.snaps(), ".clone-"+name)
}

func (d *btrfsDriver) cloneAs(ctx context.Context, snap, name string, l Limits, prepare func(root string) error) (_ Limits, err error) {
	stage := d.staging(name)
	if err := d.removeSubvolume(ctx, stage); err != nil { // a crashed attempt's
		return Limits{}, err
	}
	if _, err := run(ctx, "btrfs", "subvolume", "snapshot", filepath.Join(d.snaps(), snap), stage); err != nil {
		return Limits{}, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, d.removeSubvolume(ctx, stage))
		}
	}()
	if prepare != nil {
		if err := prepare(stage); err != nil {
			return Limits{}, fmt.Errorf("prepare clone: %w", err)
		}
	}
	if err := d.limit(ctx, stage, l.Bytes); err != nil {
		return Limits{}, err
	}
	if l.Bytes > 0 {
		u, err := d.usageAt(ctx, stage)
		if err != nil {
			return Limits{}, err
		}
		if u.Bytes > l.Bytes {
			return Limits{}, fmt.Errorf("the clone holds %d bytes, over the volume's limit of %d: %w", u.Bytes, l.Bytes, unix.EDQUOT)
		}
	}
	if err := os.Rename(stage, d.path(name)); err != nil {
		return Limits{}, err
	}
	return Limits{Bytes: l.Bytes}, syncDir(d.vols())
}

// removeStaging removes every clone a crash left in the staging (Open).
func (d *btrfsDriver) removeStaging(ctx context.Context) error {
	ents, err := os.ReadDir(d.snaps())
	if err != nil {
		return err
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".clone-") {
			if err := d.removeSubvolume(ctx, filepath.Join(d.snaps(), e.Name())); err != nil {
				return fmt.Errorf("remove half-made clone %s: %w", e.Name(), err)
			}
		}
	}
	return nil
}

// SnapshotOf returns the volume snapshot snap was taken of, or
// [ErrNotFound] when the pool holds no ready snapshot snap.
func (p *Pool) SnapshotOf(snap string) (string, error) {
	if err := checkName(snap); err != nil {
		return "", err
	}
	if err := p.lock(); err != nil {
		return "", err
	}
	defer p.mu.Unlock()
	r, err := p.readReady("snap", snap)
	if err != nil {
		return "", err
	}
	return r.From, nil
}

// SnapshotPath is where snapshot snap's tree is (read-only, in a
// directory only root reaches), where the driver has snapshots.
func (p *Pool) SnapshotPath(snap string) (string, error) {
	if err := checkName(snap); err != nil {
		return "", err
	}
	d, ok := p.drv.(*btrfsDriver)
	if !ok {
		return "", fmt.Errorf("%w: the %s driver has no snapshots", ErrNotSupported, p.drv.name())
	}
	return filepath.Join(d.snaps(), snap), nil
}
