package storage

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
)

// dirDriver makes a plain directory per volume, dir/volumes/NAME. It
// holds no budget, so it accepts none.
type dirDriver struct {
	dir string
}

var _ driver = (*dirDriver)(nil)

func (d *dirDriver) name() string            { return Dir }
func (d *dirDriver) budgets() bool           { return false }
func (d *dirDriver) path(name string) string { return filepath.Join(d.dir, "volumes", name) }
func (d *dirDriver) open(context.Context) error {
	return os.MkdirAll(filepath.Join(d.dir, "volumes"), 0o711)
}

func (d *dirDriver) check(l Limits) error {
	if l != (Limits{}) {
		return fmt.Errorf("%w: the dir driver holds no disk budget (asked for %+v); use btrfs or ext4", ErrNotSupported, l)
	}
	return nil
}

func (d *dirDriver) list() (vols, snaps []string, err error) {
	vols, err = listNames(filepath.Join(d.dir, "volumes"))
	return vols, nil, err
}

func (d *dirDriver) create(ctx context.Context, name string, l Limits) (Limits, error) {
	return Limits{}, os.Mkdir(d.path(name), 0o755)
}

func (d *dirDriver) ensure(ctx context.Context, name string, l Limits) (Limits, error) {
	_, err := os.Lstat(d.path(name))
	return Limits{}, err
}

func (d *dirDriver) grow(ctx context.Context, name string, old, l Limits) (Limits, error) {
	return Limits{}, d.check(l)
}

// usage is not counted: walking a tree the sandbox changes under us as
// root would follow its renames.
func (d *dirDriver) usage(ctx context.Context, name string) (Usage, error) {
	return Usage{}, fmt.Errorf("%w: the dir driver counts no usage", ErrNotSupported)
}

func (d *dirDriver) snapshot(ctx context.Context, name, snap string) error {
	return fmt.Errorf("%w: the dir driver has no snapshots", ErrNotSupported)
}

func (d *dirDriver) clone(ctx context.Context, snap, name string, l Limits) (Limits, error) {
	return Limits{}, fmt.Errorf("%w: the dir driver has no snapshots", ErrNotSupported)
}

// remove deletes the tree; os.RemoveAll works with *at calls relative to
// directories it holds open and never follows a symlink.
func (d *dirDriver) remove(ctx context.Context, name string) error {
	return os.RemoveAll(d.path(name))
}

func (d *dirDriver) removeSnapshot(ctx context.Context, snap string) error { return nil }
func (d *dirDriver) destroy(ctx context.Context) error                     { return nil }
