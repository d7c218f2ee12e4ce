package checkpoint_test

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/agentrunner/runner/checkpoint"
	"github.com/agentrunner/runner/internal/testcap"
)

// TestImportAsOwner: ImportAs gives every entry to the one owner and
// clears setuid (and setgid on a file, not on a directory) before
// anything is kept, so a restore writes no setuid-root program; the same
// archive imported again the same way changes nothing; Import keeps the
// owners and bits as they came (what a store moving between hosts of one
// operator wants, and what runnerd never uses).
func TestImportAsOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		testcap.Skip(t, "root", "the tree holds root-owned setuid files and a restore lchowns")
	}
	ctx := context.Background()
	src := t.TempDir()
	mk := func(rel string, mode fs.FileMode, uid int) {
		p := filepath.Join(src, rel)
		if mode.IsDir() {
			if err := os.Mkdir(p, 0o700); err != nil {
				t.Fatal(err)
			}
		} else if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(p, uid, uid); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	mk("suid", fs.ModeSetuid|0o755, 0)
	mk("sgid", fs.ModeSetgid|0o711, 77)
	mk("dir", fs.ModeDir|fs.ModeSetgid|0o775, 0)
	from := open(t, t.TempDir())
	info, err := from.Create(ctx, []string{src}, checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	arc := export(t, from, info.ID, nil)

	dir := t.TempDir()
	to := open(t, dir)
	owner := checkpoint.Owner{UID: 4321, GID: 8765}
	if _, err := to.ImportAs(ctx, bytes.NewReader(arc), owner); err != nil {
		t.Fatal(err)
	}
	before := storeState(t, dir)
	if again, err := to.ImportAs(ctx, bytes.NewReader(arc), owner); err != nil || again.ID != info.ID {
		t.Fatalf("second ImportAs: %+v, %v; want %s unchanged", again, err, info.ID)
	}
	if after := storeState(t, dir); !slices.Equal(after, before) {
		t.Errorf("second ImportAs changed the store: %v, want %v", after, before)
	}
	dst := filepath.Join(t.TempDir(), "ws")
	if err := os.Mkdir(dst, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := to.Restore(ctx, info.ID, []string{dst}); err != nil {
		t.Fatal(err)
	}
	root, err := os.Lstat(src)
	if err != nil {
		t.Fatal(err)
	}
	for rel, want := range map[string]fs.FileMode{".": root.Mode(), "suid": 0o755, "sgid": 0o711, "dir": fs.ModeDir | fs.ModeSetgid | 0o775} {
		fi, err := os.Lstat(filepath.Join(dst, rel))
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode() != want || st.Uid != 4321 || st.Gid != 8765 {
			t.Errorf("restored %s: mode %v owner %d:%d, want %v 4321:8765", rel, fi.Mode(), st.Uid, st.Gid, want)
		}
	}

	plain := open(t, t.TempDir())
	if _, err := plain.Import(ctx, bytes.NewReader(arc)); err != nil {
		t.Fatal(err)
	}
	dst2 := filepath.Join(t.TempDir(), "ws")
	if err := os.Mkdir(dst2, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := plain.Restore(ctx, info.ID, []string{dst2}); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(filepath.Join(dst2, "suid")); err != nil || fi.Mode() != fs.ModeSetuid|0o755 || fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Errorf("Import kept suid as %v, %v; want -rwsr-xr-x root", fi.Mode(), err)
	}
}
