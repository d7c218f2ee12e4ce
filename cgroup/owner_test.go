package cgroup

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestForeignRootTouchedNot: a Root that exists but belongs to another uid
// (an unprivileged runnerd's, as root; a root runnerd's, as anyone else)
// is another runnerd's. A Manager on it must not advertise limits, list
// what is in it, create a sandbox in it or remove one from it; before
// checkOwned, MkdirAll on the existing directory passed as proof of a
// writable hierarchy and New adopted it.
func TestForeignRootTouchedNot(t *testing.T) {
	owner := newTestManager(t, ModeV1)
	if err := owner.Ensure("theirs", Limits{}); err != nil {
		t.Fatal(err)
	}
	dirs := owner.b.rootDirs()
	for _, d := range dirs {
		if err := os.Chown(d, 4242, 4242); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, d := range dirs {
			os.Chown(d, 0, 0)
		}
	})
	// newTestManager's Root is one relative element: the same name, in
	// the test process's own cgroup of each hierarchy.
	m, err := New(Config{Mode: ModeV1, Root: filepath.Base(dirs[0])})
	if err != nil {
		t.Fatal(err)
	}
	err = m.Available()
	if !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), "belongs to uid 4242") {
		t.Fatalf("Available: got %v, want ErrNotSupported naming uid 4242", err)
	}
	if names, err := m.List(); err == nil || len(names) != 0 {
		t.Errorf("List: got %v, %v; want no names and an error", names, err)
	}
	if err := m.Ensure("mine", Limits{}); err == nil {
		t.Errorf("Ensure(mine): got nil, want an error")
	}
	if err := m.Remove(t.Context(), "theirs"); err == nil {
		t.Errorf("Remove(theirs): got nil, want an error")
	}
	if names, _ := owner.List(); len(names) != 1 || names[0] != "theirs" {
		t.Errorf("the owner's cgroups after: got %v, want [theirs]", names)
	}
}
