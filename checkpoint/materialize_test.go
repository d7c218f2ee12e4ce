package checkpoint_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agentrunner/runner/checkpoint"
)

// TestMaterialize: a checkpoint written into a new directory is the
// tree it was made from (bytes, modes, mtimes, symlinks); with an owner
// every entry is the owner's; the store lists nothing new and writes no
// swap record; a directory that exists, an unknown id and the wrong
// number of directories are refused with nothing written.
func TestMaterialize(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	ws := filepath.Join(base, "ws")
	sample(t, ws)
	store := filepath.Join(base, "store")
	s := open(t, store)
	info, err := s.Create(ctx, []string{ws}, checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	to := filepath.Join(base, "fork")
	if err := s.Materialize(ctx, info.ID, []string{to}, nil); err != nil {
		t.Fatal(err)
	}
	if got, want := listing(t, to), listing(t, ws); !slices.Equal(got, want) {
		t.Errorf("materialized:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if list, _ := s.List(); len(list) != 1 {
		t.Errorf("store lists %v after Materialize, want the one checkpoint", list)
	}
	if _, err := os.Stat(filepath.Join(store, "restore.json")); !os.IsNotExist(err) {
		t.Errorf("Materialize wrote a swap record: %v", err)
	}

	if os.Geteuid() == 0 {
		owned := filepath.Join(base, "owned")
		if err := s.Materialize(ctx, info.ID, []string{owned}, &checkpoint.Owner{UID: 4321, GID: 8765}); err != nil {
			t.Fatal(err)
		}
		for _, l := range listing(t, owned) {
			if !strings.Contains(l, " 4321:8765") {
				t.Errorf("entry not given to the owner: %s", l)
			}
		}
	}

	for _, tc := range []struct {
		name string
		id   string
		dirs []string
		want error
	}{
		{"existing directory", info.ID, []string{to}, checkpoint.ErrInvalid},
		{"unknown id", "ck-0000000000000000", []string{filepath.Join(base, "x")}, checkpoint.ErrUnknown},
		{"two directories for one tree", info.ID, []string{filepath.Join(base, "x"), filepath.Join(base, "y")}, checkpoint.ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := listing(t, base)
			if err := s.Materialize(ctx, tc.id, tc.dirs, nil); !errors.Is(err, tc.want) {
				t.Fatalf("Materialize = %v, want %v", err, tc.want)
			}
			if got := listing(t, base); !slices.Equal(got, before) {
				t.Errorf("a refused Materialize changed %s", base)
			}
		})
	}
}

// TestMaterializeCorruptLeavesNothing: a damaged chunk fails Materialize
// with ErrCorrupt, and the directory it was writing is gone.
func TestMaterializeCorruptLeavesNothing(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	ws := filepath.Join(base, "ws")
	for i := range 6 {
		write(t, filepath.Join(ws, fmt.Sprint("f", i)), random(uint64(i+10), 600<<10), 0o644)
	}
	store := filepath.Join(base, "store")
	s := open(t, store)
	info, err := s.Create(ctx, []string{ws}, checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	chunks := chunkFiles(t, store)
	if err := os.WriteFile(chunks[len(chunks)-1], []byte("not zstd"), 0o600); err != nil {
		t.Fatal(err)
	}
	to := filepath.Join(base, "fork")
	if err := s.Materialize(ctx, info.ID, []string{to}, nil); !errors.Is(err, checkpoint.ErrCorrupt) {
		t.Fatalf("Materialize of a damaged checkpoint = %v, want ErrCorrupt", err)
	}
	if _, err := os.Lstat(to); !os.IsNotExist(err) {
		t.Errorf("a failed Materialize left %s (%v)", to, err)
	}
}
