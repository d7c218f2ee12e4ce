package checkpoint_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/agentrunner/runner/checkpoint"
)

// BenchmarkFork is a fork's disk as runnerd makes it on a driver without
// snapshots (and today on every driver): Materialize of a checkpoint of
// the tree into a new directory (owners remapped as a fork does), beside
// cp -a of the tree. The checkpoint "now" a fork may take first is
// BenchmarkFirstCheckpoint (or BenchmarkSecondCheckpoint for a sandbox
// checkpointed before). With the tree of benchTree:
//
//	CKPT_BENCH_BYTES=1073741824 CKPT_BENCH_FILES=10000 \
//	  go test -run '^$' -bench 'Fork' -benchtime 3x ./checkpoint/
//
// storage.BenchmarkWorkspaceOf10k has the same with the pool's snapshots
// and clones.
func BenchmarkFork(b *testing.B) {
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
	b.Run("materialize", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			to := filepath.Join(b.TempDir(), "fork")
			if err := s.Materialize(context.Background(), info.ID, []string{to}, &checkpoint.Owner{UID: 4321, GID: 4321}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("cp-a", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			run(b, "cp", "-a", tree, filepath.Join(b.TempDir(), "copy"))
		}
	})
}
