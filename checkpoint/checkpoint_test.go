package checkpoint_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/checkpoint"
	"github.com/agentrunner/runner/internal/testcap"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// listing is a tree as the tests compare it: every entry's type, mode,
// owner, size, mtime, link target and content hash.
func listing(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		fi, _ := d.Info()
		line := fmt.Sprintf("%s %v %d:%d", rel, fi.Mode(), st.Uid, st.Gid)
		switch {
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			line += fmt.Sprintf(" %d %x mtime=%d", len(b), sha256.Sum256(b), st.Mtim.Nano())
		case fi.Mode()&fs.ModeSymlink != 0:
			tgt, _ := os.Readlink(p)
			line += " -> " + tgt
		case rel != ".":
			line += fmt.Sprintf(" mtime=%d", st.Mtim.Nano())
		}
		out = append(out, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func random(seed uint64, n int) []byte {
	var key [32]byte
	key[0] = byte(seed)
	b := make([]byte, n)
	rand.NewChaCha8(key).Read(b)
	return b
}

func write(t *testing.T, p string, b []byte, mode fs.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, mode); err != nil {
		t.Fatal(err)
	}
}

// sample makes a tree with every kind of entry Restore must reproduce.
func sample(t *testing.T, root string) {
	t.Helper()
	write(t, filepath.Join(root, "a.txt"), []byte("one"), 0o644)
	write(t, filepath.Join(root, "empty"), nil, 0o600)
	write(t, filepath.Join(root, "bin", "run.sh"), []byte("#!/bin/sh\necho hi\n"), 0o755)
	write(t, filepath.Join(root, "deep", "er", "big"), random(1, 3<<20), 0o640) // several chunks
	if err := os.Symlink("../a.txt", filepath.Join(root, "bin", "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(root, "ro"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(root, "ro", "f"), []byte("locked"), 0o400)
	if err := os.Chmod(filepath.Join(root, "ro"), 0o500); err != nil {
		t.Fatal(err)
	}
	old := time.Date(2020, 1, 2, 3, 4, 5, 6000, time.UTC)
	if err := os.Chtimes(filepath.Join(root, "a.txt"), old, old); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		if err := os.Lchown(filepath.Join(root, "a.txt"), 1234, 5678); err != nil {
			t.Fatal(err)
		}
	}
}

func open(t *testing.T, dir string) *checkpoint.Store {
	t.Helper()
	s, err := checkpoint.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestRoundTrip(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	ws := filepath.Join(base, "ws")
	sample(t, ws)
	want := listing(t, ws)
	s := open(t, filepath.Join(base, "store"))

	froze, thawed := 0, 0
	info, err := s.Create(ctx, []string{ws}, checkpoint.Options{Comment: "before", Freeze: func(context.Context) (func() error, error) {
		froze++
		return func() error { thawed++; return nil }, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	if froze != 1 || thawed != 1 {
		t.Errorf("froze %d, thawed %d times, want 1 and 1", froze, thawed)
	}
	if info.Comment != "before" || info.Files != 5 || info.Size != 3+0+18+3<<20+6 {
		t.Errorf("info = %+v, want comment before, 5 files, %d bytes", info, 3+18+3<<20+6)
	}
	got, err := s.Get(info.ID)
	if err != nil || got.ID != info.ID || got.Stored != info.Stored {
		t.Errorf("Get = %+v, %v; want %+v", got, err, info)
	}

	// Change, delete and add files, then restore.
	write(t, filepath.Join(ws, "a.txt"), []byte("two"), 0o644)
	os.RemoveAll(filepath.Join(ws, "deep"))
	write(t, filepath.Join(ws, "new"), []byte("new"), 0o644)
	if err := s.Restore(ctx, info.ID, []string{ws}); err != nil {
		t.Fatal(err)
	}
	if got := listing(t, ws); !slices.Equal(got, want) {
		t.Errorf("after restore:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, p := range []string{filepath.Join(base, ".restore-ws"), filepath.Join(base, ".old-ws"), filepath.Join(base, "store", "restore.json")} {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s left behind: %v", p, err)
		}
	}
}

func TestUnknownID(t *testing.T) {
	base := t.TempDir()
	ws := filepath.Join(base, "ws")
	sample(t, ws)
	s := open(t, filepath.Join(base, "store"))
	for _, id := range []string{"ck-0000000000000000", "../../etc/passwd", ""} {
		if err := s.Restore(context.Background(), id, []string{ws}); !errors.Is(err, checkpoint.ErrUnknown) {
			t.Errorf("Restore(%q) = %v, want ErrUnknown", id, err)
		}
		if _, err := s.Get(id); !errors.Is(err, checkpoint.ErrUnknown) {
			t.Errorf("Get(%q) = %v, want ErrUnknown", id, err)
		}
		if err := s.Delete(id); !errors.Is(err, checkpoint.ErrUnknown) {
			t.Errorf("Delete(%q) = %v, want ErrUnknown", id, err)
		}
	}
}

func chunkFiles(t *testing.T, store string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(filepath.Join(store, "chunks"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			out = append(out, p)
		}
		return nil
	})
	return out
}

func TestDedupAndDelete(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	ws := filepath.Join(base, "ws")
	// 256 KiB files are under the chunker's minimum: one chunk each.
	const size = 256 << 10
	for i := range 8 {
		write(t, filepath.Join(ws, fmt.Sprint("f", i)), random(uint64(i), size), 0o644)
	}
	store := filepath.Join(base, "store")
	s := open(t, store)
	first, err := s.Create(ctx, []string{ws}, checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if first.Stored < 8*size {
		t.Errorf("first checkpoint stored %d bytes of random data, want at least %d", first.Stored, 8*size)
	}
	write(t, filepath.Join(ws, "f3"), random(99, size), 0o644)
	second, err := s.Create(ctx, []string{ws}, checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if second.Stored > size+8<<10 || second.Stored < size {
		t.Errorf("second checkpoint after changing one file stored %d bytes, want about %d", second.Stored, size)
	}
	third, err := s.Create(ctx, []string{ws}, checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if third.Stored > 4<<10 {
		t.Errorf("checkpoint of an unchanged tree stored %d bytes, want only its snapshot", third.Stored)
	}
	if n := len(chunkFiles(t, store)); n != 9 {
		t.Errorf("%d chunk files, want 9 (8 files + 1 changed)", n)
	}
	if l, _ := s.List(); len(l) != 3 || l[0].ID != first.ID || l[2].ID != third.ID {
		t.Errorf("List = %+v, want the three in order", l)
	}

	before, _ := s.DiskUsage()
	if err := s.Delete(first.ID); err != nil {
		t.Fatal(err)
	}
	if n := len(chunkFiles(t, store)); n != 8 {
		t.Errorf("after deleting the first, %d chunk files, want 8 (its old f3 dropped)", n)
	}
	after, _ := s.DiskUsage()
	if after > before-size {
		t.Errorf("DiskUsage %d -> %d after dropping a %d-byte chunk", before, after, size)
	}
	if err := s.Delete(second.ID); err != nil {
		t.Fatal(err)
	}
	if n := len(chunkFiles(t, store)); n != 8 {
		t.Errorf("third still names every chunk; %d chunk files, want 8", n)
	}
	if err := s.Delete(third.ID); err != nil {
		t.Fatal(err)
	}
	if n := chunkFiles(t, store); len(n) != 0 {
		t.Errorf("no checkpoints left, chunk files remain: %v", n)
	}
}

func TestCorruptChunkFailsRestoreWithDiskUnchanged(t *testing.T) {
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
	write(t, filepath.Join(ws, "a.txt"), []byte("changed"), 0o644)
	want := listing(t, ws)
	// Flip one byte inside every chunk's plain bytes and recompress it:
	// a valid zstd frame of the right length, so only the hash check
	// catches it.
	dec, _ := zstd.NewReader(nil)
	enc, _ := zstd.NewWriter(nil)
	for _, c := range chunkFiles(t, store) {
		z, _ := os.ReadFile(c)
		plain, err := dec.DecodeAll(z, nil)
		if err != nil {
			t.Fatal(err)
		}
		plain[len(plain)/2] ^= 0x40
		if err := os.WriteFile(c, enc.EncodeAll(plain, nil), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	err = s.Restore(ctx, info.ID, []string{ws})
	if !errors.Is(err, checkpoint.ErrCorrupt) {
		t.Fatalf("Restore of a corrupted checkpoint = %v, want ErrCorrupt", err)
	}
	if got := listing(t, ws); !slices.Equal(got, want) {
		t.Errorf("disk changed by a failed restore:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	entries, _ := os.ReadDir(base)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("failed restore left %s", e.Name())
		}
	}
}

func TestDiskFullKeepsNothing(t *testing.T) {
	if os.Geteuid() != 0 {
		testcap.Skip(t, "root", "mounting a tmpfs")
	}
	ctx := context.Background()
	base := t.TempDir()
	ws := filepath.Join(base, "ws")
	for i := range 3 {
		write(t, filepath.Join(ws, fmt.Sprint("f", i)), random(uint64(i), 1<<20), 0o644)
	}
	small := filepath.Join(base, "small")
	os.Mkdir(small, 0o700)
	if err := unix.Mount("tmpfs", small, "tmpfs", 0, "size=2m"); err != nil {
		testcap.Skip(t, "tmpfs", err.Error())
	}
	t.Cleanup(func() { unix.Unmount(small, unix.MNT_DETACH) })
	s := open(t, filepath.Join(small, "store"))
	// A first checkpoint that fits, which the failed one must not disturb.
	write(t, filepath.Join(base, "tiny", "t"), []byte("fits"), 0o644)
	kept, err := s.Create(ctx, []string{filepath.Join(base, "tiny")}, checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	usage, _ := s.DiskUsage()
	_, err = s.Create(ctx, []string{ws}, checkpoint.Options{})
	if !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("Create on a full disk = %v, want ENOSPC", err)
	}
	if l, _ := s.List(); len(l) != 1 || l[0].ID != kept.ID {
		t.Errorf("List after a failed checkpoint = %+v, want only %s", l, kept.ID)
	}
	if got, _ := s.DiskUsage(); got != usage {
		t.Errorf("DiskUsage %d after the failed checkpoint, want %d (nothing half-written kept)", got, usage)
	}
	snaps, _ := os.ReadDir(filepath.Join(small, "store", "snapshots"))
	if len(snaps) != 1 {
		t.Errorf("snapshots %v, want one", snaps)
	}
}

// TestMain doubles as the crash helper: with CKPT_CRASH set, the test
// binary runs one operation and kills itself with SIGKILL at the step.
func TestMain(m *testing.M) {
	if spec := os.Getenv("CKPT_CRASH"); spec != "" {
		crashHelper(spec)
		os.Exit(3) // the step was never reached
	}
	os.Exit(m.Run())
}

type crashSpec struct {
	Op, Step, Store, Root, ID string
}

func crashHelper(spec string) {
	var cs crashSpec
	json.Unmarshal([]byte(spec), &cs)
	checkpoint.SetCrash(func(step string) {
		if step == cs.Step {
			unix.Kill(os.Getpid(), unix.SIGKILL)
			select {}
		}
	})
	s, err := checkpoint.Open(cs.Store)
	if err != nil {
		os.Exit(4)
	}
	switch cs.Op {
	case "create":
		_, err = s.Create(context.Background(), []string{cs.Root}, checkpoint.Options{})
	case "restore":
		err = s.Restore(context.Background(), cs.ID, []string{cs.Root})
	case "import": // Root is the archive's file
		var f *os.File
		if f, err = os.Open(cs.Root); err == nil {
			_, err = s.Import(context.Background(), f)
		}
	}
	if err != nil {
		os.Exit(5)
	}
}

func crashAt(t *testing.T, cs crashSpec) {
	t.Helper()
	b, _ := json.Marshal(cs)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "CKPT_CRASH="+string(b))
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != unix.SIGKILL {
		t.Fatalf("helper at step %s: %v, want killed by SIGKILL", cs.Step, err)
	}
}

func TestKillDuringCheckpointListsNothingPartial(t *testing.T) {
	for _, step := range []string{"chunks", "snapshot", "index"} {
		t.Run(step, func(t *testing.T) {
			base := t.TempDir()
			ws := filepath.Join(base, "ws")
			sample(t, ws)
			store := filepath.Join(base, "store")
			crashAt(t, crashSpec{Op: "create", Step: step, Store: store, Root: ws})
			s := open(t, store)
			l, err := s.List()
			if err != nil {
				t.Fatal(err)
			}
			if step != "index" {
				if len(l) != 0 {
					t.Errorf("killed before the index: List = %+v, want none", l)
				}
				if c := chunkFiles(t, store); len(c) != 0 {
					t.Errorf("killed before the index: %d chunk files kept after Open", len(c))
				}
				if snaps, _ := os.ReadDir(filepath.Join(store, "snapshots")); len(snaps) != 0 {
					t.Errorf("snapshots kept: %v", snaps)
				}
				return
			}
			// Killed after the index: the checkpoint is whole.
			if len(l) != 1 {
				t.Fatalf("List = %+v, want the one checkpoint", l)
			}
			want := listing(t, ws)
			os.RemoveAll(filepath.Join(ws, "deep"))
			if err := s.Restore(context.Background(), l[0].ID, []string{ws}); err != nil {
				t.Fatal(err)
			}
			if got := listing(t, ws); !slices.Equal(got, want) {
				t.Errorf("restore of the checkpoint the crash kept differs")
			}
		})
	}
}

func TestKillDuringRestoreLeavesOldOrNew(t *testing.T) {
	for _, tc := range []struct {
		step string
		new  bool // the recovered disk is the checkpoint's
	}{{"staging", false}, {"staged", false}, {"aside", true}, {"swapped", true}} {
		t.Run(tc.step, func(t *testing.T) {
			base := t.TempDir()
			ws := filepath.Join(base, "ws")
			sample(t, ws)
			store := filepath.Join(base, "store")
			s, err := checkpoint.Open(store)
			if err != nil {
				t.Fatal(err)
			}
			info, err := s.Create(context.Background(), []string{ws}, checkpoint.Options{})
			if err != nil {
				t.Fatal(err)
			}
			s.Close()
			ckpt := listing(t, ws)
			write(t, filepath.Join(ws, "a.txt"), []byte("after"), 0o644)
			os.RemoveAll(filepath.Join(ws, "bin"))
			old := listing(t, ws)

			crashAt(t, crashSpec{Op: "restore", Step: tc.step, Store: store, Root: ws, ID: info.ID})
			open(t, store) // recovery
			want := old
			if tc.new {
				want = ckpt
			}
			if got := listing(t, ws); !slices.Equal(got, want) {
				t.Errorf("killed at %s, recovered disk:\n%s\nwant (new=%v):\n%s", tc.step, strings.Join(got, "\n"), tc.new, strings.Join(want, "\n"))
			}
			entries, _ := os.ReadDir(base)
			for _, e := range entries {
				if strings.HasPrefix(e.Name(), ".") {
					t.Errorf("recovery left %s", e.Name())
				}
			}
		})
	}
}

// TestReadingDuringCheckpointKeepsIt: a reader that opens the store while
// a checkpoint has written its chunks but not yet its index sees no
// checkpoint, and the checkpoint completes whole (a recovering Open at
// that moment would take it for a crashed attempt and delete its chunks).
func TestReadingDuringCheckpointKeepsIt(t *testing.T) {
	base := t.TempDir()
	ws := filepath.Join(base, "ws")
	sample(t, ws)
	want := listing(t, ws)
	store := filepath.Join(base, "store")
	s := open(t, store)
	reached, release := make(chan struct{}), make(chan struct{})
	checkpoint.SetCrash(func(step string) {
		if step == "chunks" {
			close(reached)
			<-release
		}
	})
	defer checkpoint.SetCrash(func(string) {})
	type result struct {
		info checkpoint.Info
		err  error
	}
	done := make(chan result, 1)
	go func() {
		info, err := s.Create(context.Background(), []string{ws}, checkpoint.Options{})
		done <- result{info, err}
	}()
	<-reached
	r, err := checkpoint.OpenForReading(store)
	if err != nil {
		t.Fatal(err)
	}
	if l, err := r.List(); err != nil || len(l) != 0 {
		t.Errorf("List during a checkpoint = %+v, %v; want none yet", l, err)
	}
	r.Close()
	close(release)
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	os.RemoveAll(filepath.Join(ws, "deep"))
	if err := s.Restore(context.Background(), res.info.ID, []string{ws}); err != nil {
		t.Fatalf("Restore of the checkpoint a reader saw in progress: %v", err)
	}
	if got := listing(t, ws); !slices.Equal(got, want) {
		t.Errorf("restored tree differs")
	}
}
