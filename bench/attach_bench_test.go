package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/wire"
)

// benchBins is runnerd built once for the Go benchmarks of this file.
var benchBins struct {
	once sync.Once
	dir  string
	bins binaries
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if benchBins.dir != "" {
		os.RemoveAll(benchBins.dir)
	}
	os.Exit(code)
}

// replayBytes is the finished stream BenchmarkAttachReplay reads per op.
const replayBytes = 64 << 20

// replaySetup starts an in-process daemon (so -benchmem counts the
// daemon's allocations) with a finished replayBytes session.
func replaySetup(b *testing.B) (*harness, string, string) {
	b.Helper()
	benchBins.once.Do(func() {
		benchBins.dir, benchBins.err = os.MkdirTemp("", "runnerbench-go-")
		if benchBins.err == nil {
			benchBins.bins, benchBins.err = build(context.Background(), benchBins.dir, false)
		}
	})
	if benchBins.err != nil {
		b.Fatal(benchBins.err)
	}
	ctx := context.Background()
	d, err := startInProcess(ctx, filepath.Join(b.TempDir(), "state"), []string{benchBins.bins.runnerd, "shim"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(d.stop)
	h := &harness{cfg: Config{Log: nil}, d: d}
	sb, err := h.newSandbox(ctx, "replay")
	if err != nil {
		b.Fatal(err)
	}
	if _, _, err := d.c.CreateSession(ctx, sb, wire.CreateSession{ID: "s", Argv: []string{"head", "-c", fmt.Sprint(replayBytes), "/dev/zero"}}); err != nil {
		b.Fatal(err)
	}
	if err := h.waitExit(ctx, sb, "s"); err != nil {
		b.Fatal(err)
	}
	return h, sb, "s"
}

// BenchmarkAttachReplay replays a finished 64 MiB stream through the
// daemon's WebSocket attach path per op, with the daemon in this process.
// raw reads messages into one reused buffer, so its allocs/frame are
// (nearly all) the daemon's attach loop; client is the real
// client.FrameReader, whose own per-frame cost is the difference.
func BenchmarkAttachReplay(b *testing.B) {
	h, sb, id := replaySetup(b)
	ctx := context.Background()
	b.Run("raw", func(b *testing.B) {
		frames := 0
		measure(b, &frames, func() {
			got, n, err := rawAttach(ctx, h.d, sb, id)
			if err != nil {
				b.Fatal(err)
			}
			if got != replayBytes {
				b.Fatalf("replayed %d bytes, want %d", got, replayBytes)
			}
			frames += n
		})
	})
	b.Run("client", func(b *testing.B) {
		frames := 0
		measure(b, &frames, func() {
			fr, err := h.d.c.Attach(ctx, sb, id, client.Cursors{})
			if err != nil {
				b.Fatal(err)
			}
			defer fr.Close()
			for {
				f, err := fr.Next()
				if err != nil {
					b.Fatal(err)
				}
				if f.Kind.Terminal() {
					break
				}
				frames++
			}
		})
	})
}

// measure runs op b.N times and reports frames/op, allocs/frame and
// B/frame (every allocation of the process: daemon and reader).
func measure(b *testing.B, frames *int, op func()) {
	b.SetBytes(replayBytes)
	b.ReportAllocs()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	b.ResetTimer()
	for b.Loop() {
		op()
	}
	b.StopTimer()
	runtime.ReadMemStats(&after)
	if *frames == 0 {
		return
	}
	n := float64(*frames)
	b.ReportMetric(n/float64(b.N), "frames/op")
	b.ReportMetric(float64(after.Mallocs-before.Mallocs)/n, "allocs/frame")
	b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/n, "B/frame")
}
