package sandboxes

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentrunner/runner/daemon/registry"
	"golang.org/x/sys/unix"
)

// TestPrivateTmpNeverFollowsLinks: makePrivateTmp chmods each private
// directory 01777 as root; a symlink in place of one (which no sandbox
// can make: its directory is root's, but root must not rely on it) fails
// the call and leaves the link's target as it was, instead of opening it
// to every user.
func TestPrivateTmpNeverFollowsLinks(t *testing.T) {
	state := t.TempDir()
	s := &Manager{cfg: Config{StateDir: state}}
	sb := registry.Sandbox{Name: "hostile", Incarnation: "0123456789abcdef"}
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.Mkdir(victim, 0o700); err != nil {
		t.Fatal(err)
	}
	dir := s.privateTmpDir(sb)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(dir, "var-tmp")); err != nil {
		t.Fatal(err)
	}
	_, err := s.makePrivateTmp(sb)
	if !errors.Is(err, unix.ENOTDIR) && !errors.Is(err, unix.ELOOP) {
		t.Errorf("makePrivateTmp with var-tmp a link: %v, want ENOTDIR or ELOOP", err)
	}
	if fi, err := os.Stat(victim); err != nil || fi.Mode() != os.ModeDir|0o700 {
		t.Errorf("the link's target: %v, %v; want drwx------ unchanged", fi.Mode(), err)
	}
	// Without the link it makes them, 01777.
	os.Remove(filepath.Join(dir, "var-tmp"))
	if _, err := s.makePrivateTmp(sb); err != nil {
		t.Fatal(err)
	}
	for _, b := range privateTmps {
		if fi, err := os.Lstat(filepath.Join(dir, b.Source)); err != nil || fi.Mode() != os.ModeDir|os.ModeSticky|0o777 {
			t.Errorf("%s: %v, %v; want drwxrwxrwt", b.Source, fi.Mode(), err)
		}
	}
}
