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

// The figures, each beside its baseline in the same run (on a
// quiet machine: every stage uses every core):
//
//	CKPT_BENCH_BYTES=1073741824 CKPT_BENCH_FILES=10000 \
//	  go test -run '^$' -bench . -benchtime 3x ./checkpoint/
//
//	BenchmarkFirstCheckpoint   Create of the tree         vs tar | zstd -1
//	BenchmarkSecondCheckpoint  after one new 1 MiB file: time, new bytes, frozen p50
//	BenchmarkRestore           Restore                    vs cp -a
//	BenchmarkExport            Export (and Create+Export) vs tar | zstd -1
//	BenchmarkImport            Import (and Import+Restore) vs cp -a
//	BenchmarkSecondExport      archive bytes for a receiver holding the first
//
// Unset, the tree is tiny (8 MiB, 100 files); CKPT_BENCH_BYTES=1048576
// CKPT_BENCH_FILES=10 with -benchtime 1x only proves they run.
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

// archiveOf checkpoints tree into a fresh store and exports it to a file.
func archiveOf(b *testing.B, tree string) (s *checkpoint.Store, info checkpoint.Info, path string) {
	b.Helper()
	s, err := checkpoint.Open(filepath.Join(b.TempDir(), "store"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	if info, err = s.Create(context.Background(), []string{tree}, checkpoint.Options{}); err != nil {
		b.Fatal(err)
	}
	path = filepath.Join(b.TempDir(), "archive")
	exportTo(b, s, info.ID, path, nil)
	return s, info, path
}

func exportTo(b *testing.B, s *checkpoint.Store, id, path string, have func(string) bool) int64 {
	b.Helper()
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	n, err := s.Export(context.Background(), id, f, have)
	if err != nil {
		b.Fatal(err)
	}
	return n
}

// BenchmarkExport: a tree to an archive file, beside tar | zstd -1 of the
// same tree. "export" is a checkpoint made earlier; "create+export" the
// whole way from the tree (a first checkpoint, then its export).
func BenchmarkExport(b *testing.B) {
	tree, _ := benchTree(b)
	s, info, _ := archiveOf(b, tree)
	b.Run("export", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			n := exportTo(b, s, info.ID, filepath.Join(b.TempDir(), "archive"), nil)
			b.ReportMetric(float64(n), "archive-bytes")
		}
	})
	b.Run("create+export", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			s, err := checkpoint.Open(filepath.Join(b.TempDir(), "store"))
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			info, err := s.Create(context.Background(), []string{tree}, checkpoint.Options{})
			if err != nil {
				b.Fatal(err)
			}
			n := exportTo(b, s, info.ID, filepath.Join(b.TempDir(), "archive"), nil)
			b.ReportMetric(float64(n), "archive-bytes")
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
		}
	})
}

// BenchmarkImport: an archive file into a fresh store ("import"), and on
// to a restored tree ("import+restore": what moving a sandbox costs at
// the receiver), beside cp -a of the tree.
func BenchmarkImport(b *testing.B) {
	tree, _ := benchTree(b)
	_, _, arc := archiveOf(b, tree)
	for _, restore := range []bool{false, true} {
		name := "import"
		if restore {
			name = "import+restore"
		}
		b.Run(name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				dir := b.TempDir()
				s, err := checkpoint.Open(filepath.Join(dir, "store"))
				if err != nil {
					b.Fatal(err)
				}
				f, err := os.Open(arc)
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				info, err := s.Import(context.Background(), f)
				if err != nil {
					b.Fatal(err)
				}
				if restore {
					if err := s.Restore(context.Background(), info.ID, []string{filepath.Join(dir, "ws")}); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				f.Close()
				s.Close()
				b.StartTimer()
			}
		})
	}
	b.Run("cp-a", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			run(b, "cp", "-a", tree, filepath.Join(b.TempDir(), "copy"))
		}
	})
}

// BenchmarkSecondExport: after a first checkpoint the receiver holds,
// one new 1 MiB file, a second checkpoint and its export for that
// receiver: the bytes it adds (issue: at most 2 MiB).
func BenchmarkSecondExport(b *testing.B) {
	tree, _ := benchTree(b)
	s, first, _ := archiveOf(b, tree)
	have, err := s.Chunks(first.ID)
	if err != nil {
		b.Fatal(err)
	}
	changed := filepath.Join(tree, "changed")
	var total int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		buf := make([]byte, 1<<20)
		rand.NewChaCha8([32]byte{byte(i), byte(i >> 8), 1}).Read(buf)
		if err := os.WriteFile(changed, buf, 0o644); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		info, err := s.Create(context.Background(), []string{tree}, checkpoint.Options{})
		if err != nil {
			b.Fatal(err)
		}
		total += exportTo(b, s, info.ID, filepath.Join(b.TempDir(), "archive"), have)
	}
	b.StopTimer()
	b.ReportMetric(float64(total)/float64(b.N), "archive-bytes/op")
}
