package shim

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/shim/internal/proto"
	"github.com/agentrunner/runner/shim/internal/shimtest"
	"github.com/agentrunner/runner/shim/sessiondir"
)

// TestStdinOffsets: an offset write is written when its offset is the
// shim's count, skips what the command already got when it is behind
// (part of it or all of it), and is refused, writing nothing, when it is
// ahead (a gap). Plain writes count too. The command reads each byte
// once, in order.
func TestStdinOffsets(t *testing.T) {
	dir, _ := shimtest.Start(t, sessiondir.Spec{Argv: []string{"cat"}})
	c := shimtest.Dial(t, dir)
	ctx := shimtest.CtxT(t, 20*time.Second)
	at := func(off int64, p string, want int64) {
		t.Helper()
		n, err := c.WriteStdinAt(ctx, off, []byte(p))
		if err != nil || n != want {
			t.Fatalf("WriteStdinAt(%d, %q) = %d, %v; want %d, nil", off, p, n, err, want)
		}
	}
	if n, err := c.StdinCount(ctx); err != nil || n != 0 {
		t.Fatalf("StdinCount before any write = %d, %v; want 0", n, err)
	}
	at(0, "abc", 3)   // equal
	at(1, "bcdef", 6) // behind: "bc" skipped, "def" written
	at(2, "cd", 6)    // behind by all of it: nothing written
	at(6, "", 6)      // empty: a checked probe
	_, err := c.WriteStdinAt(ctx, 10, []byte("zz"))
	if !errors.Is(err, sessiondir.ErrStdinGap) || !errors.Is(err, sessiondir.ErrInvalid) || !strings.Contains(err.Error(), "10") || !strings.Contains(err.Error(), "6") {
		t.Fatalf("WriteStdinAt(10) after 6 bytes: %v; want ErrStdinGap (also ErrInvalid) naming 10 and 6", err)
	}
	if err := c.WriteStdin(ctx, []byte("gh")); err != nil {
		t.Fatal(err)
	}
	if n, err := c.StdinCount(ctx); err != nil || n != 8 {
		t.Fatalf("StdinCount after a plain write = %d, %v; want 8", n, err)
	}
	at(7, "hij", 10)
	got := closeToExit(t, ctx, c, dir)
	if string(got) != "abcdefghij" {
		t.Fatalf("the command read %q, want %q", got, "abcdefghij")
	}
	if _, err := c.WriteStdinAt(ctx, 10, []byte("k")); !errors.Is(err, sessiondir.ErrExited) {
		t.Fatalf("WriteStdinAt after the exit: %v, want ErrExited", err)
	}
}

// TestStdinOffsetResendAfterAbandon: a write cut while part of it is in
// the pipe (runnerd killed mid-write: its connection closes) and sent
// again with the same offset delivers each byte exactly once. Without
// the offset the resend writes the delivered prefix twice.
func TestStdinOffsetResendAfterAbandon(t *testing.T) {
	for _, withOffset := range []bool{true, false} {
		name := map[bool]string{true: "offset", false: "plain"}[withOffset]
		t.Run(name, func(t *testing.T) {
			fifo := filepath.Join(t.TempDir(), "go")
			if err := syscall.Mkfifo(fifo, 0o600); err != nil {
				t.Fatal(err)
			}
			dir, st := shimtest.Start(t, sessiondir.Spec{Argv: []string{"/bin/sh", "-c", `read x < "$1" && exec /bin/cat`, "sh", fifo}})
			c := shimtest.Dial(t, dir)
			head := []byte("head\n")
			if n, err := c.WriteStdinAt(shimtest.CtxT(t, 10*time.Second), 0, head); err != nil || n != int64(len(head)) {
				t.Fatalf("first write: %d, %v", n, err)
			}
			a := pattern(proto.MaxStdinAtChunk)
			// The caller goes once the shim has put part of a into the
			// pipe (nobody reads it).
			nc := shimtest.DialRaw(t, dir)
			body := binary.BigEndian.AppendUint64(nil, uint64(len(head)))
			if _, err := proto.WriteMsg(nc, nil, proto.OpWriteAt, append(body, a...)); err != nil {
				t.Fatal(err)
			}
			filled := pipeFilled(t, st.PID) - len(head)
			nc.Close()
			// The abandoned write has stopped once the count settles.
			var n int64
			var err error
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				if n, err = c.StdinCount(shimtest.CtxT(t, 10*time.Second)); err != nil {
					t.Fatal(err)
				}
				if n > int64(len(head)) || time.Now().After(deadline) {
					break
				}
			}
			if n <= int64(len(head)) || n >= int64(len(head)+len(a)) {
				t.Fatalf("count after the abandoned write: %d, want a part of it past %d (the pipe had %d of it)", n, len(head), filled)
			}
			werr := make(chan error, 1)
			go func() {
				if withOffset {
					_, err := c.WriteStdinAt(context.Background(), int64(len(head)), a)
					werr <- err
				} else {
					werr <- c.WriteStdin(context.Background(), a)
				}
			}()
			openGate(t, fifo)
			if err := <-werr; err != nil {
				t.Fatalf("resend: %v", err)
			}
			got := closeToExit(t, shimtest.CtxT(t, 10*time.Second), c, dir)
			// With the offset: head, then a once. Plain (today's
			// protocol, which must stay as it was): the resend writes the
			// delivered prefix again.
			want := append(append([]byte{}, head...), a...)
			if !withOffset {
				want = append(append(append([]byte{}, head...), a[:n-int64(len(head))]...), a...)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%s resend: the command read %d bytes, want %d (%d of the write delivered before the cut; equal prefix %d)",
					name, len(got), len(want), n-int64(len(head)), commonPrefix(got, want))
			}
		})
	}
}
