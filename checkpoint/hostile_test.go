package checkpoint_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentrunner/runner/checkpoint"
	"golang.org/x/sys/unix"
)

// TestCreateNeverReadsThroughASwappedLink: while checkpoints of a tree are
// made without a freeze, another process swaps a directory of the tree
// with a symlink to a victim directory, as fast as it can (a process not
// frozen with the sandbox: another sandbox running as the same user). No
// checkpoint ever holds the victim's file: the walk opens every entry
// relative to its directory's descriptor with O_NOFOLLOW, never by a path
// that would follow the link. (A walk by path, filepath.WalkDir, stored
// the victim's chunk within a few hundred checkpoints.)
func TestCreateNeverReadsThroughASwappedLink(t *testing.T) {
	base := t.TempDir()
	root, victim := filepath.Join(base, "ws"), filepath.Join(base, "victim")
	secret := bytes.Repeat([]byte("victim's secret "), 64)
	sum := sha256.Sum256(secret)
	secretChunk := hex.EncodeToString(sum[:])
	for _, d := range []string{filepath.Join(root, "d", "sub"), victim, filepath.Join(victim, "sub")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{filepath.Join(victim, "secret"), filepath.Join(victim, "sub", "secret")} {
		if err := os.WriteFile(f, secret, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "d", "mine"), []byte("mine\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(root, "l")); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	st, err := checkpoint.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			unix.Renameat2(unix.AT_FDCWD, filepath.Join(root, "d"), unix.AT_FDCWD, filepath.Join(root, "l"), unix.RENAME_EXCHANGE)
		}
	}()
	defer func() { close(stop); <-done }()
	made, failed := 0, 0
	for range 150 {
		info, err := st.Create(context.Background(), []string{root}, checkpoint.Options{})
		if err != nil {
			failed++ // a swap under an open: the checkpoint is not made
			continue
		}
		made++
		// mine is seen once, or twice (as d, then as l after a swap), or
		// not at all: never anything else.
		if info.Size%int64(len("mine\n")) != 0 || info.Size > 2*int64(len("mine\n")) {
			t.Fatalf("checkpoint %s: %d bytes, want only the tree's own (0, 5 or 10)", info.ID, info.Size)
		}
		if _, err := os.Stat(filepath.Join(dir, "chunks", secretChunk[:2], secretChunk)); err == nil {
			t.Fatalf("checkpoint %s stored the victim's secret", info.ID)
		}
		if err := st.Delete(info.ID); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d checkpoints made, %d failed on a swap", made, failed)
}
