package shim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/shim/internal/proto"
	"github.com/agentrunner/runner/shim/internal/shimtest"
	"github.com/agentrunner/runner/shim/sessiondir"
	"golang.org/x/sys/unix"
)

// abandonWrite sends one stdin write of p on a fresh control connection
// and gives up on it as runnerd does when its caller leaves: it closes the
// connection without waiting for the answer. With half it calls sent once
// the request is sent, then only shuts its sending side and returns the
// shim's answer, which then still arrives.
func abandonWrite(t *testing.T, dir string, p []byte, half bool, sent func()) (st byte, body []byte) {
	t.Helper()
	c := shimtest.DialRaw(t, dir)
	defer c.Close()
	if _, err := proto.WriteMsg(c, nil, proto.OpWrite, p); err != nil {
		t.Fatalf("send stdin write: %v", err)
	}
	if !half {
		return 0, nil
	}
	sent()
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	// Only a bound for a shim that never answers (the defect this tests).
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	var hdr [proto.CtlHdrLen]byte
	st, body, err := proto.ReadMsg(c, &hdr, nil)
	if err != nil {
		t.Fatalf("answer to an abandoned stdin write: %v (the shim still holds it)", err)
	}
	return st, body
}

// privateDirty is the Private_Dirty of process pid in bytes, from
// /proc/PID/smaps_rollup: the memory only it holds and has written.
func privateDirty(t *testing.T, pid int) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Private_Dirty:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("smaps_rollup: %q: %v", sc.Text(), err)
			}
			return kb << 10
		}
	}
	t.Fatalf("smaps_rollup of %d has no Private_Dirty", pid)
	return 0
}

// pipeFilled waits until the stdin pipe of command pid holds bytes and
// returns how many: the shim's write has delivered them. It reads the
// count through a second read end of the pipe (opened by /proc), which it
// never reads from.
func pipeFilled(t *testing.T, pid int) int {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/fd/0", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		n, err := unix.IoctlGetInt(int(f.Fd()), unix.TIOCINQ)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return n
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("the shim wrote nothing into the command's stdin")
	return 0
}

// TestAbandonedStdinWritesFreeTheShim: a command that never reads its
// stdin, and many callers who each give up on a 1 MiB write (runnerd
// closes its control connection when its HTTP caller leaves). Each write
// stops when its connection closes, so the shim's private memory stays
// near its baseline, also when the writes wait behind one whose caller
// still waits (they leave the queue). Before, each abandoned write kept
// its chunk blocked in the shim until the command read, ended or was
// terminated: the shim grew by ~1 MiB per write (here Private_Dirty
// several times its baseline), and a close-stdin waited behind them
// forever.
func TestAbandonedStdinWritesFreeTheShim(t *testing.T) {
	for _, tc := range []struct {
		name string
		live bool // a write whose caller waits holds stdin first
	}{
		{"alone", false},
		{"behind a live write", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, st := shimtest.Start(t, sessiondir.Spec{Argv: []string{"sleep", "600"}})
			chunk := pattern(proto.MaxStdinChunk)
			c := shimtest.Dial(t, dir)
			var live chan error
			cancel := func() {}
			if tc.live {
				var ctx context.Context
				ctx, cancel = context.WithCancel(context.Background())
				defer cancel()
				live = make(chan error, 1)
				go func() { live <- c.WriteStdin(ctx, chunk) }()
				pipeFilled(t, st.PID) // it has the turn, and waits for the command
			}
			// Baseline: the shim once it has served two abandoned chunks,
			// so the buffers one write needs are counted in it.
			for range 2 {
				abandonWrite(t, dir, chunk, false, nil)
			}
			base := privateDirty(t, st.ShimPID)
			const writes = 64
			for range writes {
				abandonWrite(t, dir, chunk, false, nil)
			}
			after := privateDirty(t, st.ShimPID)
			t.Logf("shim Private_Dirty: %d KiB at baseline, %d KiB after %d abandoned 1 MiB writes", base>>10, after>>10, writes)
			if after > 2*base {
				t.Errorf("shim Private_Dirty grew from %d KiB to %d KiB after %d abandoned writes: more than twice its baseline", base>>10, after>>10, writes)
			}
			if tc.live {
				cancel() // the live caller gives up too: its write stops
				if err := <-live; !errors.Is(err, context.Canceled) {
					t.Fatalf("live write after its caller gave up: got %v, want context.Canceled", err)
				}
			}
			// Nothing holds stdin any more: a close-stdin gets its turn.
			if err := c.CloseStdin(shimtest.CtxT(t, 20*time.Second)); err != nil {
				t.Fatalf("close stdin after abandoned writes: %v", err)
			}
		})
	}
}

// TestAbandonedStdinWriteDeliversAPrefixOnce: a write whose caller gives
// up while it is partly in the pipe stops there. The command reads that
// prefix once, never the rest, and the next write (acknowledged) right
// after it. The shim's answer, which a caller that only shut its sending
// side still reads, says how much was delivered.
func TestAbandonedStdinWriteDeliversAPrefixOnce(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "go")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	// The command reads nothing until the test opens the fifo, then copies
	// its stdin to stdout.
	dir, st := shimtest.Start(t, sessiondir.Spec{Argv: []string{"/bin/sh", "-c", `read x < "$1" && exec /bin/cat`, "sh", fifo}})
	a := pattern(proto.MaxStdinChunk)
	b := bytes.Repeat([]byte("after the abandoned write\n"), 4096)

	// Once the shim has put bytes into the pipe (full: nobody reads it),
	// the caller gives up: the shim is inside its write when it learns so.
	var filled int
	ast, abody := abandonWrite(t, dir, a, true, func() { filled = pipeFilled(t, st.PID) })
	var e proto.ErrBody
	if ast != proto.StError || json.Unmarshal(abody, &e) != nil || e.Code != proto.CodeUnavailable {
		t.Fatalf("answer to the abandoned write: status %d %q, want %d with code %s", ast, abody, proto.StError, proto.CodeUnavailable)
	}
	var n, size int
	if _, err := fmt.Sscanf(e.Detail, "stdin write abandoned by its caller: %d of %d bytes delivered", &n, &size); err != nil {
		t.Fatalf("detail %q: %v", e.Detail, err)
	}
	if n != filled || size != len(a) {
		t.Fatalf("detail %q: want %d of %d bytes delivered (the pipe holds %d)", e.Detail, filled, len(a), filled)
	}

	c := shimtest.Dial(t, dir)
	werr := make(chan error, 1)
	go func() { werr <- c.WriteStdin(context.Background(), b) }()
	openGate(t, fifo)
	if err := <-werr; err != nil {
		t.Fatalf("write after the abandoned one: %v", err)
	}
	got := closeToExit(t, shimtest.CtxT(t, 10*time.Second), c, dir)
	want := append(append([]byte{}, a[:n]...), b...)
	if !bytes.Equal(got, want) {
		t.Fatalf("the command read %d bytes, want %d: the abandoned write's first %d bytes once, then the next write (equal prefix %d)",
			len(got), len(want), n, commonPrefix(got, want))
	}
}

func commonPrefix(a, b []byte) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}
