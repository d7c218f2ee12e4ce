package checkpoint_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	"github.com/agentrunner/runner/checkpoint"
	"go.uber.org/goleak"
)

// failingWriter takes n bytes, then fails every write.
type failingWriter struct{ n int }

var errWriter = errors.New("receiver went away")

func (w *failingWriter) Write(p []byte) (int, error) {
	if len(p) > w.n {
		k := w.n
		w.n = 0
		return k, errWriter
	}
	w.n -= len(p)
	return len(p), nil
}

// TestPipelinesStopWhole: a Create whose context is canceled while its
// workers run, an Export whose receiver fails midway, and an Import cut
// short each return their error, keep nothing (no chunk, no checkpoint
// listed) and leave no goroutine behind once the stores are closed.
func TestPipelinesStopWhole(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	undo := checkpoint.SetParallel(4)
	defer undo()
	ctx := context.Background()
	base := t.TempDir()
	ws := filepath.Join(base, "ws")
	for i := range 24 {
		write(t, filepath.Join(ws, fmt.Sprint("f", i)), random(uint64(i), 700<<10), 0o644)
	}
	adir, bdir := filepath.Join(base, "a"), filepath.Join(base, "b")
	a, err := checkpoint.Open(adir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := checkpoint.Open(bdir)
	if err != nil {
		t.Fatal(err)
	}

	// Canceled once its first chunk is stored, the other workers busy.
	cctx, cancel := context.WithCancel(ctx)
	checkpoint.SetCrash(func(step string) {
		if step == "chunk" {
			cancel()
		}
	})
	thawed := 0
	_, err = a.Create(cctx, []string{ws}, checkpoint.Options{Freeze: func(context.Context) (func() error, error) {
		return func() error { thawed++; return nil }, nil
	}})
	checkpoint.SetCrash(func(string) {})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Create canceled midway = %v, want context.Canceled", err)
	}
	if thawed != 1 {
		t.Errorf("thawed %d times, want 1", thawed)
	}
	if c := chunkFiles(t, adir); len(c) != 0 {
		t.Errorf("canceled Create kept %d chunks", len(c))
	}
	if l, _ := a.List(); len(l) != 0 {
		t.Errorf("canceled Create listed %v", l)
	}

	info, err := a.Create(ctx, []string{ws}, checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var full bytes.Buffer
	if _, err := a.Export(ctx, info.ID, &full, nil); err != nil {
		t.Fatal(err)
	}
	for _, cut := range []int{0, 100, full.Len() / 3, full.Len() - 10} {
		if _, err := a.Export(ctx, info.ID, &failingWriter{n: cut}, nil); !errors.Is(err, errWriter) {
			t.Errorf("Export to a receiver failing after %d bytes = %v, want its error", cut, err)
		}
		if _, err := b.Import(ctx, bytes.NewReader(full.Bytes()[:cut])); !errors.Is(err, checkpoint.ErrCorrupt) {
			t.Errorf("Import of the first %d bytes = %v, want ErrCorrupt", cut, err)
		}
	}
	if l, _ := b.List(); len(l) != 0 {
		t.Errorf("List after cut imports = %v", l)
	}
	if c := chunkFiles(t, bdir); len(c) != 0 {
		t.Errorf("cut imports kept %d chunks", len(c))
	}
	if l, _ := a.List(); !slices.Equal(l, []checkpoint.Info{info}) {
		t.Errorf("exporter's List = %v, want only %v", l, info)
	}
	a.Close()
	b.Close()
}
