package checkpoint_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/agentrunner/runner/checkpoint"
)

// The figures, each beside its baseline in the same run:
//
//	CKPT_BENCH_BYTES=1073741824 CKPT_BENCH_FILES=10000 \
//	  go test -run '^$' -bench . -benchtime 3x ./checkpoint/
//
// Unset, the tree is tiny (8 MiB, 100 files) so CI only proves the
// benchmark runs.
func benchTree(b *testing.B) (dir string, files int) {
	b.Helper()
	size, files := int64(8<<20), 100
	if v, err := strconv.ParseInt(os.Getenv("CKPT_BENCH_BYTES"), 10, 64); err == nil && v > 0 {
		size = v
	}
	if v, err := strconv.Atoi(os.Getenv("CKPT_BENCH_FILES")); err == nil && v > 0 {
		files = v
	}
	dir = filepath.Join(b.TempDir(), "tree")
	per := int(size / int64(files))
	r := rand.New(rand.NewPCG(1, 2))
	for i := range files {
		p := filepath.Join(dir, fmt.Sprintf("d%02d", i%100), fmt.Sprintf("f%05d", i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			b.Fatal(err)
		}
		// Half random bytes, half text: data that compresses about 2x, as
		// source trees and build outputs do.
		buf := make([]byte, per)
		for j := 0; j < per/2; j++ {
			buf[j] = byte(r.Uint32())
		}
		for j := per / 2; j < per; j++ {
			buf[j] = "the quick brown fox jumps over the lazy dog\n"[j%44]
		}
		if err := os.WriteFile(p, buf, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	return dir, files
}

func run(b *testing.B, name string, args ...string) {
	b.Helper()
	cmd := exec.Command(name, args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("%s %v: %v: %s", name, args, err, out)
	}
}

func BenchmarkFirstCheckpoint(b *testing.B) {
	tree, _ := benchTree(b)
	b.Run("checkpoint", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			store := filepath.Join(b.TempDir(), "store")
			s, err := checkpoint.Open(store)
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			info, err := s.Create(context.Background(), []string{tree}, checkpoint.Options{})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(info.Stored), "stored-bytes")
			s.Close()
		}
	})
	b.Run("tar-zstd-1", func(b *testing.B) {
		if _, err := exec.LookPath("zstd"); err != nil {
			b.Skip("no zstd binary")
		}
		for i := 0; i < b.N; i++ {
			out := filepath.Join(b.TempDir(), "tree.tar.zst")
			run(b, "sh", "-c", `tar -C "$1" -cf - . | zstd -1 -q -o "$2"`, "sh", tree, out)
			b.StopTimer()
			if fi, err := os.Stat(out); err == nil {
				b.ReportMetric(float64(fi.Size()), "stored-bytes")
			}
			b.StartTimer()
		}
	})
}

// BenchmarkSecondCheckpoint changes one 1 MiB file, then checkpoints:
// its time, its new bytes, and the p50 of its frozen time (the freeze
// spans the walk and the one changed file's read).
func BenchmarkSecondCheckpoint(b *testing.B) {
	tree, _ := benchTree(b)
	s, err := checkpoint.Open(filepath.Join(b.TempDir(), "store"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Create(context.Background(), []string{tree}, checkpoint.Options{}); err != nil {
		b.Fatal(err)
	}
	changed := filepath.Join(tree, "changed")
	var frozen []time.Duration
	var stored int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		buf := make([]byte, 1<<20)
		rand.NewChaCha8([32]byte{byte(i), byte(i >> 8)}).Read(buf)
		if err := os.WriteFile(changed, buf, 0o644); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		info, err := s.Create(context.Background(), []string{tree}, checkpoint.Options{
			Freeze: func(context.Context) (func() error, error) { return func() error { return nil }, nil },
		})
		if err != nil {
			b.Fatal(err)
		}
		frozen = append(frozen, info.Frozen)
		stored += info.Stored
	}
	b.StopTimer()
	slices.Sort(frozen)
	b.ReportMetric(float64(frozen[len(frozen)/2].Microseconds())/1000, "frozen-ms-p50")
	b.ReportMetric(float64(stored)/float64(b.N), "new-bytes/op")
}

func BenchmarkRestore(b *testing.B) {
	tree, _ := benchTree(b)
	s, err := checkpoint.Open(filepath.Join(b.TempDir(), "store"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	info, err := s.Create(context.Background(), []string{tree}, checkpoint.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("restore", func(b *testing.B) {
		target := filepath.Join(b.TempDir(), "ws")
		run(b, "mkdir", target)
		for i := 0; i < b.N; i++ {
			if err := s.Restore(context.Background(), info.ID, []string{target}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("cp-a", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			target := filepath.Join(b.TempDir(), "copy")
			b.StartTimer()
			run(b, "cp", "-a", tree, target)
			b.StopTimer()
			os.RemoveAll(target)
			b.StartTimer()
		}
	})
}
