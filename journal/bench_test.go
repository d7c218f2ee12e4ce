package journal

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"
)

// The benchmarks report ratios against a baseline measured in the same
// run; docs/benchmarks.md has the figures and the commands.

const chunk = 64 << 10

// BenchmarkAppend writes 64 KiB chunks: a plain write(2) loop to one file
// (the baseline), the journal with its default fsync policy, and the
// journal with periodic fsync disabled (to isolate the policy's cost).
func BenchmarkAppend(b *testing.B) {
	buf := patternBytes(0, 0, chunk)
	b.Run("write2", func(b *testing.B) {
		f, err := os.Create(filepath.Join(b.TempDir(), "plain"))
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		b.SetBytes(chunk)
		for b.Loop() {
			if _, err := f.Write(buf); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, tc := range []struct {
		name string
		sync time.Duration
	}{{"journal", 0}, {"journal-nosync", 24 * time.Hour}} {
		b.Run(tc.name, func(b *testing.B) {
			w, err := Create(filepath.Join(b.TempDir(), "j"), Options{Streams: []string{"stdout", "stderr"}, SyncInterval: tc.sync})
			if err != nil {
				b.Fatal(err)
			}
			defer w.Close()
			b.SetBytes(chunk)
			for b.Loop() {
				if _, err := w.Write("stdout", buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkAppendRatio alternates 64 MiB of 64 KiB writes through the
// journal (default options) and through a plain write(2) loop, and reports
// journal throughput / plain throughput. Each op writes 128 MiB; Create
// (a few fsyncs) and the final Close are outside the timed append path, the
// writer's periodic fsync (default 1 s) is inside it.
func BenchmarkAppendRatio(b *testing.B) {
	const per = 64 << 20
	buf := patternBytes(0, 0, chunk)
	dir := b.TempDir()
	var plain, journal time.Duration
	i := 0
	for b.Loop() {
		i++
		start := time.Now()
		f, err := os.Create(filepath.Join(dir, "plain"+strconv.Itoa(i)))
		if err != nil {
			b.Fatal(err)
		}
		for range per / chunk {
			if _, err := f.Write(buf); err != nil {
				b.Fatal(err)
			}
		}
		f.Close()
		plain += time.Since(start)

		w, err := Create(filepath.Join(dir, "j"+strconv.Itoa(i)), Options{Streams: []string{"stdout", "stderr"}})
		if err != nil {
			b.Fatal(err)
		}
		start = time.Now()
		for range per / chunk {
			if _, err := w.Write("stdout", buf); err != nil {
				b.Fatal(err)
			}
		}
		journal += time.Since(start)
		w.Close() // the final sync is not part of the append path
		os.RemoveAll(filepath.Join(dir, "j"+strconv.Itoa(i)))
		os.Remove(filepath.Join(dir, "plain"+strconv.Itoa(i)))
	}
	b.SetBytes(2 * per)
	b.ReportMetric(float64(per)*float64(i)/plain.Seconds()/(1<<20), "plain-MiB/s")
	b.ReportMetric(float64(per)*float64(i)/journal.Seconds()/(1<<20), "journal-MiB/s")
	b.ReportMetric(plain.Seconds()/journal.Seconds(), "ratio")
}

// buildJournal writes size bytes to stdout of a new finished journal.
func buildJournal(b *testing.B, dir string, size int64) {
	b.Helper()
	w, err := Create(dir, Options{Streams: []string{"stdout", "stderr"}, SyncInterval: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	for off := int64(0); off < size; off += int64(len(buf)) {
		n := min(int64(len(buf)), size-off)
		if _, err := w.Write("stdout", buf[:n]); err != nil {
			b.Fatal(err)
		}
	}
	if err := w.Finish(Exit{Reason: ReasonExited}); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkFirstByte measures open + NewReader at the middle + first read
// in a small (1 MiB) and a big journal, alternating, and reports big/small.
// The big journal is 256 MiB by default, 4 GiB with JOURNAL_BENCH_BIG=1.
func BenchmarkFirstByte(b *testing.B) {
	big := int64(256 << 20)
	if os.Getenv("JOURNAL_BENCH_BIG") != "" {
		big = 4 << 30
	}
	base := b.TempDir()
	small := filepath.Join(base, "small")
	large := filepath.Join(base, "large")
	buildJournal(b, small, 1<<20)
	buildJournal(b, large, big)
	buf := make([]byte, 4096)
	ttfb := func(dir string, size int64) time.Duration {
		start := time.Now()
		j, err := Open(dir)
		if err != nil {
			b.Fatal(err)
		}
		r, err := j.NewReader("stdout", size/2+12345, false)
		if err != nil {
			b.Fatal(err)
		}
		if n, err := r.Read(buf); n == 0 || err != nil {
			b.Fatalf("read: %d, %v", n, err)
		}
		d := time.Since(start)
		r.Close()
		j.Close()
		return d
	}
	var ds, dl []time.Duration
	for b.Loop() {
		ds = append(ds, ttfb(small, 1<<20))
		dl = append(dl, ttfb(large, big))
	}
	ps, pl := pct(ds, 50), pct(dl, 50)
	b.ReportMetric(float64(ps.Nanoseconds()), "small-p50-ns")
	b.ReportMetric(float64(pl.Nanoseconds()), "big-p50-ns")
	b.ReportMetric(float64(pl)/float64(ps), "ratio")
	b.ReportMetric(float64(big>>20), "big-MiB")
}

func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[(len(s)-1)*p/100]
}

// BenchmarkFollowLatency measures write → wake-up of a reader blocked at
// the end of the stream, against the same through a pipe between two
// goroutines. Each op is one 64-byte write and the wake-up it causes.
func BenchmarkFollowLatency(b *testing.B) {
	msg := patternBytes(0, 0, 64)
	run := func(b *testing.B, write func([]byte) error, read func([]byte) (int, error)) {
		got := make(chan time.Time)
		errc := make(chan error, 1)
		go func() {
			buf := make([]byte, 4096)
			for {
				if _, err := read(buf); err != nil {
					errc <- err
					close(got)
					return
				}
				got <- time.Now()
			}
		}()
		var lat []time.Duration
		for b.Loop() {
			time.Sleep(200 * time.Microsecond) // let the reader block
			start := time.Now()
			if err := write(msg); err != nil {
				b.Fatal(err)
			}
			t, ok := <-got
			if !ok {
				b.Fatal(<-errc)
			}
			lat = append(lat, t.Sub(start))
		}
		b.ReportMetric(float64(pct(lat, 50).Nanoseconds()), "p50-ns")
		b.ReportMetric(float64(pct(lat, 99).Nanoseconds()), "p99-ns")
	}
	b.Run("pipe", func(b *testing.B) {
		pr, pw, err := os.Pipe()
		if err != nil {
			b.Fatal(err)
		}
		defer pr.Close()
		run(b, func(p []byte) error { _, err := pw.Write(p); return err }, pr.Read)
		pw.Close()
	})
	// follow runs over a new one-stream journal in dir, read by a follow
	// Reader woken by wt (nil: an inotify instance of its own).
	follow := func(b *testing.B, dir string, wt *Watcher) {
		w := mustCreate(b, dir, Options{Streams: []string{"stdout"}})
		r, err := mustOpen(b, dir).NewReaderWatched(wt, "stdout", 0, true)
		if err != nil {
			b.Fatal(err)
		}
		defer r.Close()
		run(b, func(p []byte) error { _, err := w.Write("stdout", p); return err }, r.Read)
		if err := w.Finish(Exit{Reason: ReasonExited}); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("journal", func(b *testing.B) {
		follow(b, filepath.Join(b.TempDir(), "j"), nil)
	})
	// The same through a shared Watcher, as runnerd reads, with 99 other
	// idle followers on 33 other journals registered on it.
	b.Run("journal-watcher", func(b *testing.B) {
		wt := NewWatcher(WatcherOptions{})
		defer wt.Close()
		root := b.TempDir()
		for i := range 33 {
			dir := filepath.Join(root, strconv.Itoa(i))
			mustCreate(b, dir, Options{Streams: []string{"stdout", "stderr"}})
			j := mustOpen(b, dir)
			for _, s := range []string{"stdout", "stderr", "stdout"} {
				r, err := j.NewReaderWatched(wt, s, 0, true)
				if err != nil {
					b.Fatal(err)
				}
				defer r.Close()
				arm(b, r) // registers with wt
			}
		}
		follow(b, filepath.Join(root, "j"), wt)
	})
}

// BenchmarkSyncPoint measures one sync point of the fsync policy: fsync of
// the segment written since the last one (1 MiB here) plus the index
// commit. With the default SyncInterval the writer pays this at most once a
// second, in its background goroutine, not on the write path.
func BenchmarkSyncPoint(b *testing.B) {
	w, err := Create(filepath.Join(b.TempDir(), "j"), Options{Streams: []string{"stdout"}, SyncInterval: 24 * time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	buf := patternBytes(0, 0, chunk)
	var syncs time.Duration
	for b.Loop() {
		for range 16 {
			if _, err := w.Write("stdout", buf); err != nil {
				b.Fatal(err)
			}
		}
		start := time.Now()
		if err := w.Sync(); err != nil {
			b.Fatal(err)
		}
		syncs += time.Since(start)
	}
	b.ReportMetric(float64(syncs.Nanoseconds())/float64(b.N), "sync-ns/op")
}

// BenchmarkCreateFinish: what a session's journal costs from Create to
// Finish with the full-disk reserve (an extra file, fallocated, renamed
// into exit.json's temporary name at Finish) against the baseline without
// it, in one run.
func BenchmarkCreateFinish(b *testing.B) {
	for _, bc := range []struct {
		name    string
		reserve int64
	}{{"no reserve", 0}, {"reserve", ReserveBytes}} {
		b.Run(bc.name, func(b *testing.B) {
			old := reserveBytes
			reserveBytes = bc.reserve
			defer func() { reserveBytes = old }()
			root := b.TempDir()
			b.ResetTimer()
			for i := range b.N {
				w, err := Create(filepath.Join(root, strconv.Itoa(i)), Options{Streams: []string{"stdout", "stderr"}, DeferCreateSync: true})
				if err != nil {
					b.Fatal(err)
				}
				if err := w.Finish(Exit{Reason: ReasonExited}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
