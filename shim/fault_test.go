package shim

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentrunner/runner/journal"
	"github.com/agentrunner/runner/wire"
)

// Fault tests: disk full, run-as user, network namespace, and the drain
// window's edges. The ones that need root skip loudly without it.

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED: needs root (mount, setuid, network namespaces); run the shim tests as root to cover this path")
	}
}

// tmpfsDir mounts a tmpfs of the given size (e.g. "2m") on a fresh
// directory and unmounts it when the test ends (after every cleanup
// registered later, such as the session's).
func tmpfsDir(t *testing.T, size string) string {
	t.Helper()
	root, err := os.MkdirTemp("", "shf")
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", root, "tmpfs", 0, "size="+size+",mode=0700"); err != nil {
		os.Remove(root)
		t.Fatalf("mount tmpfs on %s: %v", root, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(root, 0); err != nil {
			t.Errorf("unmount %s: %v (detaching it)", root, err)
			unix.Unmount(root, unix.MNT_DETACH)
		}
		os.Remove(root)
	})
	return root
}

func remountSize(t *testing.T, dir, size string) {
	t.Helper()
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_REMOUNT, "size="+size); err != nil {
		t.Fatalf("remount %s with size %s: %v", dir, size, err)
	}
}

// startAt is start with a caller-chosen session directory.
func startAt(t *testing.T, dir string, spec Spec) Status {
	t.Helper()
	if spec.ID == "" {
		spec.ID = "t1"
	}
	if spec.Env == nil {
		spec.Env = testEnv
	}
	st, err := Start(ctxT(t, 10*time.Second), shimExe, dir, spec)
	if err != nil {
		t.Fatalf("start %q: %v", spec.Argv, err)
	}
	t.Cleanup(func() {
		if c, err := Dial(ctxT(t, 5*time.Second), dir); err == nil {
			c.Terminate(ctxT(t, 10*time.Second), 100*time.Millisecond)
			c.Close()
		}
		waitGone(t, st.ShimPID)
	})
	return st
}

// pattern returns n deterministic, incompressible-looking bytes.
func pattern(n int) []byte {
	r := rand.New(rand.NewPCG(1, 2))
	b := make([]byte, n)
	for i := 0; i < n; i += 8 {
		v := r.Uint64()
		for j := 0; j < 8 && i+j < n; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return b
}

// waitStatus polls the shim's status until cond holds.
func waitStatus(t *testing.T, c *Client, what string, cond func(Status) bool) Status {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var st Status
	var err error
	for time.Now().Before(deadline) {
		st, err = c.Status(ctxT(t, 5*time.Second))
		if err == nil && cond(st) {
			return st
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("waiting for %s: last status %+v %v", what, st, err)
	return st
}

// processState returns the State line's letter of /proc/PID/status
// (R, S, D, Z, ...), or "" if the process is gone.
func processState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "State:\t"); ok && v != "" {
			return v[:1]
		}
	}
	return ""
}

// TestDiskFullBackpressure: a shim that cannot write its journal stops
// reading, so the command blocks (no byte is dropped), Status says
// write_error meanwhile, and once space is back the journal holds exactly
// the command's bytes and the true exit.
func TestDiskFullBackpressure(t *testing.T) {
	needRoot(t)
	t.Parallel()
	const size = 8 << 20
	want := pattern(size)
	src := filepath.Join(t.TempDir(), "pattern")
	if err := os.WriteFile(src, want, 0o600); err != nil {
		t.Fatal(err)
	}
	mnt := tmpfsDir(t, "2m")
	dir := filepath.Join(mnt, "s")
	// "done" goes to stderr only after cat wrote every byte: while it is
	// absent the command has not got past its output.
	startAt(t, dir, Spec{Argv: []string{"sh", "-c", `cat "$0"; echo done >&2; exit 7`, src}, Dir: "/"})
	c := dial(t, dir)

	st := waitStatus(t, c, "write_error", func(st Status) bool { return st.WriteError != "" })
	if st.State != StateRunning {
		t.Fatalf("while the disk is full: got state %q, want running", st.State)
	}
	if !strings.Contains(st.WriteError, syscall.ENOSPC.Error()) {
		t.Errorf("write_error %q does not name ENOSPC", st.WriteError)
	}
	// Backpressure: for a while nothing moves. The journal stays short of
	// the output, stderr stays empty (cat has not finished), and the
	// command is still there.
	n0, _ := readStream(dir, "stdout")
	time.Sleep(700 * time.Millisecond)
	n1, _ := readStream(dir, "stdout")
	if len(n1) >= size {
		t.Fatalf("journal holds %d bytes on a 2 MiB disk", len(n1))
	}
	if len(n1) != len(n0) {
		t.Errorf("journal grew from %d to %d bytes on a full disk", len(n0), len(n1))
	}
	if !bytes.Equal(n1, want[:len(n1)]) {
		t.Fatalf("journal prefix (%d bytes) differs from the written bytes", len(n1))
	}
	if e, _ := readStream(dir, "stderr"); len(e) != 0 {
		t.Fatalf("stderr %q: the command got past its output on a full disk (bytes were dropped)", e)
	}
	st, err := c.Status(ctxT(t, 5*time.Second))
	if err != nil || st.State != StateRunning || st.WriteError == "" {
		t.Fatalf("after 700ms of a full disk: got %+v %v, want running with write_error", st, err)
	}
	if ps := processState(st.PID); ps == "" || ps == "Z" {
		t.Fatalf("command %d: state %q, want alive (blocked)", st.PID, ps)
	}

	remountSize(t, mnt, "64m")
	e := waitExit(t, dir)
	if e.Reason != journal.ReasonExited || e.Code != 7 {
		t.Fatalf("exit: got %+v, want exited 7", e)
	}
	got, err := readStream(dir, "stdout")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		i := 0
		for i < len(got) && i < len(want) && got[i] == want[i] {
			i++
		}
		t.Fatalf("stdout: got %d bytes, want exactly the %d written (first difference at %d)", len(got), len(want), i)
	}
	if e.Lengths["stdout"] != size || e.Lengths["stderr"] != 5 {
		t.Errorf("exit lengths: got %v, want stdout %d, stderr 5", e.Lengths, size)
	}
	if b, _ := readStream(dir, "stderr"); string(b) != "done\n" {
		t.Errorf("stderr: got %q, want %q", b, "done\n")
	}
	st, err = c.Status(ctxT(t, 5*time.Second))
	if err != nil || st.WriteError != "" {
		t.Errorf("after space came back: got %+v %v, want no write_error", st, err)
	}
}

// TestDiskFullAtExit: the disk fills after the last output byte, so the
// exit record cannot be written. The session must stay running (never
// lost, never a made-up exit) with write_error set, an attached reader
// must not see a lost frame, and once space is back the true exit is
// recorded.
func TestDiskFullAtExit(t *testing.T) {
	needRoot(t)
	t.Parallel()
	mnt := tmpfsDir(t, "4m")
	dir := filepath.Join(mnt, "s")
	startAt(t, dir, Spec{Argv: []string{"sh", "-c", `echo ready; read x; echo "bye $x"; exit 4`}, Dir: "/"})
	waitOutput(t, dir, "ready\n")
	c := dial(t, dir)

	// An attach that follows live: its terminal frame must be the exit.
	type result struct {
		out  string
		term wire.Frame
		err  error
	}
	attached := make(chan result, 1)
	go func() {
		var r result
		var out bytes.Buffer
		r.err = Attach(ctxT(t, 30*time.Second), dir, AttachOptions{}, func(b []byte) error {
			f, err := wire.ParseFrame(b)
			if err != nil {
				return err
			}
			if f.Kind == wire.FrameData && f.Stream == wire.StreamStdout {
				out.Write(f.Payload)
			}
			if f.Kind.Terminal() {
				r.term = f
				r.term.Payload = bytes.Clone(f.Payload)
			}
			return nil
		})
		r.out = out.String()
		attached <- r
	}()

	// Fill the disk completely. Freed first thing at cleanup, so that a
	// failing test still lets the shim finish and exit.
	filler, err := os.Create(filepath.Join(mnt, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(filler.Name()) })
	buf := make([]byte, 64<<10)
	for {
		if _, err := filler.Write(buf); err != nil {
			break
		}
	}
	for _, n := range []int{4096, 512, 1} {
		for {
			if _, err := filler.Write(buf[:n]); err != nil {
				break
			}
		}
	}
	filler.Close()

	if err := c.WriteStdin(ctxT(t, 5*time.Second), []byte("now\n")); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, c, "write_error", func(st Status) bool { return st.WriteError != "" })
	// For a while: running (from the shim and from disk), never lost.
	deadline := time.Now().Add(1500 * time.Millisecond)
	for time.Now().Before(deadline) {
		ds, err := ReadStatus(dir)
		if err != nil {
			t.Fatal(err)
		}
		if ds.State != StateRunning {
			t.Fatalf("while the exit record cannot be written: ReadStatus got %q (%+v), want running", ds.State, ds)
		}
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case r := <-attached:
		t.Fatalf("attach ended while the exit record could not be written: terminal %s %q, err %v", r.term.Kind, r.term.Payload, r.err)
	default:
	}

	if err := os.Remove(filepath.Join(mnt, "filler")); err != nil {
		t.Fatal(err)
	}
	e := waitExit(t, dir)
	if e.Reason != journal.ReasonExited || e.Code != 4 {
		t.Fatalf("exit: got %+v, want exited 4", e)
	}
	r := <-attached
	if r.err != nil {
		t.Fatalf("attach: %v", r.err)
	}
	we, err := r.term.Exit()
	if r.term.Kind != wire.FrameExit || err != nil || we.Code != 4 {
		t.Fatalf("attach terminal: got %s %+v %v, want exit 4", r.term.Kind, we, err)
	}
	if r.out != "ready\nbye now\n" {
		t.Errorf("attach stdout: got %q", r.out)
	}
}

var _ = errors.Is
