package atomicfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

func TestWriteFile(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write func(string, []byte, fs.FileMode) error
	}{
		{"WriteFile", WriteFile},
		{"WriteFileSync", WriteFileSync},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, "f")
			if err := os.WriteFile(p, []byte("old"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := tc.write(p, []byte("new"), 0o600); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(p)
			if err != nil || string(b) != "new" {
				t.Fatalf("got %q, %v, want \"new\"", b, err)
			}
			fi, err := os.Stat(p)
			if err != nil || fi.Mode().Perm() != 0o600 {
				t.Fatalf("got mode %v, %v, want 0600 (the new file's)", fi.Mode().Perm(), err)
			}
			if _, err := os.Stat(p + ".tmp"); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("temporary file left: %v", err)
			}
			if err := SyncDir(dir); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestWriteFileFailureKeepsOld: a rename that cannot happen (the target is
// a non-empty directory) leaves neither a temporary file nor a change.
func TestWriteFileFailureKeepsOld(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "d")
	if err := os.MkdirAll(filepath.Join(p, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(p, []byte("new"), 0o600); err == nil {
		t.Fatal("got nil, want the rename's error")
	}
	if _, err := os.Stat(p + ".tmp"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("temporary file left: %v", err)
	}
	if err := SyncDir(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("SyncDir of a missing dir: got %v, want fs.ErrNotExist", err)
	}
}
