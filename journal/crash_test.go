package journal

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.uber.org/goleak"
)

const (
	envChildDir  = "JOURNAL_TEST_CHILD_DIR"
	envChildSeed = "JOURNAL_TEST_CHILD_SEED"
)

var crashStreams = []string{"stdout", "stderr"}

func TestMain(m *testing.M) {
	if dir := os.Getenv(envChildDir); dir != "" {
		seed, _ := strconv.ParseUint(os.Getenv(envChildSeed), 10, 64)
		crashChild(dir, seed)
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// crashChild is the writer process of TestCrashRecover: it creates or
// recovers the journal in dir, then writes pattern bytes in random chunks
// to random streams until it is killed, printing "stream length" after
// every acknowledged write.
func crashChild(dir string, seed uint64) {
	var w *Writer
	var err error
	if _, serr := os.Stat(filepath.Join(dir, indexName)); serr != nil {
		w, err = Create(dir, Options{Streams: crashStreams, SegmentBytes: 4096, SyncInterval: 3 * time.Millisecond, MarkInterval: time.Millisecond})
	} else {
		w, err = Recover(dir)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(2)
	}
	out := bufio.NewWriter(os.Stdout)
	rng := rand.New(rand.NewPCG(seed, 7))
	for {
		s := rng.IntN(2)
		n := rng.IntN(3000)
		if rng.IntN(10) == 0 {
			n = rng.IntN(20000) // spans several segments
		}
		off := w.Len(crashStreams[s])
		if _, err := w.Write(crashStreams[s], patternBytes(s, off, n)); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(2)
		}
		fmt.Fprintf(out, "%d %d\n", s, off+int64(n))
		out.Flush()
		if rng.IntN(50) == 0 {
			time.Sleep(time.Millisecond)
		}
	}
}

// verifyStream checks that stream s of the journal is exactly the pattern
// from start to end, and returns end.
func verifyStream(t *testing.T, j *Journal, s int) int64 {
	t.Helper()
	start, end, err := j.Bounds(crashStreams[s])
	if err != nil {
		t.Fatal(err)
	}
	got := readRange(t, j, crashStreams[s], start)
	if want := patternBytes(s, start, int(end-start)); !bytes.Equal(got, want) {
		i := 0
		for i < len(got) && i < len(want) && got[i] == want[i] {
			i++
		}
		t.Fatalf("stream %s: %d bytes, first difference at offset %d", crashStreams[s], len(got), start+int64(i))
	}
	return end
}

// checkIndex compares index.db (no writer may hold it) with the files.
func checkIndex(t *testing.T, dir string) {
	t.Helper()
	db, err := bolt.Open(filepath.Join(dir, indexName), 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Fatalf("open index: %v", err)
	}
	defer db.Close()
	err = db.View(func(tx *bolt.Tx) error {
		for _, name := range crashStreams {
			b := tx.Bucket(bktStreams).Bucket([]byte(name))
			start, end, files, err := bounds(filepath.Join(dir, name))
			if err != nil {
				return err
			}
			var idx []int64
			b.Bucket(bktSegs).ForEach(func(k, v []byte) error { idx = append(idx, getU64(k)); return nil })
			if fmt.Sprint(idx) != fmt.Sprint(files) {
				return fmt.Errorf("stream %s: index segments %v, files %v", name, idx, files)
			}
			if l, st := getU64(b.Get(keyLength)), getU64(b.Get(keyStart)); l != end || st != start {
				return fmt.Errorf("stream %s: index [%d, %d], files [%d, %d]", name, st, l, start, end)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestCrashRecover(t *testing.T) {
	rounds := 4
	if testing.Short() {
		rounds = 2
	}
	if v, _ := strconv.Atoi(os.Getenv("JOURNAL_CRASH_ROUNDS")); v > 0 {
		rounds = v
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "j")
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	for round := range rounds {
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), envChildDir+"="+dir, fmt.Sprintf("%s=%d", envChildSeed, seed+uint64(round)))
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Acknowledged lengths, from the child's reports.
		var acked [2]int64
		var ackMu sync.Mutex
		first := make(chan struct{})
		scanDone := make(chan struct{})
		go func() {
			defer close(scanDone)
			sc := bufio.NewScanner(stdout)
			once := sync.OnceFunc(func() { close(first) })
			for sc.Scan() {
				f := strings.Fields(sc.Text())
				s, _ := strconv.Atoi(f[0])
				n, _ := strconv.ParseInt(f[1], 10, 64)
				ackMu.Lock()
				acked[s] = max(acked[s], n)
				ackMu.Unlock()
				once()
			}
			once()
		}()
		select {
		case <-first:
		case <-time.After(20 * time.Second):
			t.Fatalf("child wrote nothing; stderr: %s", stderr.String())
		}
		// Followers in this process, from random cursors, while it writes.
		j := mustOpen(t, dir)
		type res struct {
			s      int
			cursor int64
			b      []byte
			err    error
		}
		results := make(chan res, 4)
		for i := range 4 {
			s := i % 2
			_, end, err := j.Bounds(crashStreams[s])
			if err != nil {
				t.Fatal(err)
			}
			cursor := rng.Int64N(end + 1)
			r, err := j.NewReader(crashStreams[s], cursor, true)
			if err != nil {
				t.Fatal(err)
			}
			go func() {
				defer r.Close()
				b, err := io.ReadAll(r)
				results <- res{s, cursor, b, err}
			}()
		}
		time.Sleep(time.Duration(5+rng.IntN(150)) * time.Millisecond)
		cmd.Process.Signal(syscall.SIGKILL)
		<-scanDone
		cmd.Wait()
		for range 4 {
			select {
			case r := <-results:
				if !errors.Is(r.err, ErrLost) {
					t.Fatalf("round %d: follower ended with %v, want ErrLost", round, r.err)
				}
				if !bytes.Equal(r.b, patternBytes(r.s, r.cursor, len(r.b))) {
					t.Fatalf("round %d: follower of %s from %d read wrong bytes", round, crashStreams[r.s], r.cursor)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("round %d: follower did not end after SIGKILL", round)
			}
		}
		if ok, _ := j.WriterAlive(); ok {
			t.Fatalf("round %d: writer alive after SIGKILL", round)
		}
		w, err := Recover(dir)
		if err != nil {
			t.Fatalf("round %d: Recover: %v", round, err)
		}
		for s, name := range crashStreams {
			if got := w.Len(name); got < acked[s] {
				t.Fatalf("round %d: %s recovered %d bytes, %d were acknowledged", round, name, got, acked[s])
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		checkIndex(t, dir)
		for s := range crashStreams {
			verifyStream(t, j, s)
		}
		t.Logf("round %d: lengths %d %d (acked %d %d)", round, w.Len("stdout"), w.Len("stderr"), acked[0], acked[1])
	}
	// End the journal as lost; a follower from 0 ends at the exit lengths.
	w, err := Recover(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Finish(Exit{Reason: ReasonLost, Detail: "test"}); err != nil {
		t.Fatal(err)
	}
	j := mustOpen(t, dir)
	e, ok, err := j.Exit()
	if err != nil || !ok || e.Reason != ReasonLost {
		t.Fatalf("Exit: got %+v, %v, %v", e, ok, err)
	}
	for s, name := range crashStreams {
		end := verifyStream(t, j, s)
		if e.Lengths[name] != end {
			t.Fatalf("exit length of %s: got %d, want %d", name, e.Lengths[name], end)
		}
		r, err := j.NewReader(name, 0, true)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(r)
		r.Close()
		if err != nil || int64(len(b)) != end {
			t.Fatalf("follow finished %s: got %d bytes, %v; want %d, nil", name, len(b), err, end)
		}
	}
	if _, err := Recover(dir); !errors.Is(err, ErrFinished) {
		t.Fatalf("Recover of finished journal: got %v, want ErrFinished", err)
	}
}
