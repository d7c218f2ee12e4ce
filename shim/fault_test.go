package shim

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentrunner/runner/journal"
	"github.com/agentrunner/runner/shim/internal/shimtest"
	"github.com/agentrunner/runner/shim/launch"
	"github.com/agentrunner/runner/shim/sessiondir"
	"github.com/agentrunner/runner/wire"
)

// Fault tests: disk full, run-as user, network namespace, and the drain
// window's edges. The ones that need root skip loudly without it.

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

// patternFile writes pattern(n) to a file and returns the bytes and the
// file's path.
func patternFile(t *testing.T, n int) ([]byte, string) {
	t.Helper()
	b := pattern(n)
	path := filepath.Join(t.TempDir(), "pattern")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return b, path
}

// waitStatus polls the shim's status until cond holds.
func waitStatus(t *testing.T, c *launch.Client, what string, cond func(sessiondir.Status) bool) sessiondir.Status {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var st sessiondir.Status
	var err error
	for time.Now().Before(deadline) {
		st, err = c.Status(shimtest.CtxT(t, 5*time.Second))
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

// fillDisk fills the filesystem at mnt completely with mnt/filler, which
// is removed first thing at cleanup, so that a failing test still lets the
// shim finish and exit.
func fillDisk(t *testing.T, mnt string) {
	t.Helper()
	filler, err := os.Create(filepath.Join(mnt, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(filler.Name()) })
	defer filler.Close()
	buf := make([]byte, 64<<10)
	for _, n := range []int{len(buf), 4096, 512, 1} {
		for {
			if _, err := filler.Write(buf[:n]); err != nil {
				break
			}
		}
	}
}

// TestDiskFullBackpressure: a shim that cannot write its journal stops
// reading, so the command blocks (no byte is dropped), Status says
// write_error meanwhile, and once space is back the journal holds exactly
// the command's bytes and the true exit.
func TestDiskFullBackpressure(t *testing.T) {
	shimtest.NeedRoot(t)
	t.Parallel()
	const size = 8 << 20
	want, src := patternFile(t, size)
	mnt := tmpfsDir(t, "2m")
	dir := filepath.Join(mnt, "s")
	// "done" goes to stderr only after cat wrote every byte: while it is
	// absent the command has not got past its output.
	shimtest.StartAt(t, dir, sessiondir.Spec{Argv: []string{"sh", "-c", `cat "$0"; echo done >&2; exit 7`, src}, Dir: "/"})
	c := shimtest.Dial(t, dir)

	st := waitStatus(t, c, "write_error", func(st sessiondir.Status) bool { return st.WriteError != "" })
	if st.State != sessiondir.StateRunning {
		t.Fatalf("while the disk is full: got state %q, want running", st.State)
	}
	if !strings.Contains(st.WriteError, syscall.ENOSPC.Error()) {
		t.Errorf("write_error %q does not name ENOSPC", st.WriteError)
	}
	// Backpressure: for a while nothing moves. The journal stays short of
	// the output, stderr stays empty (cat has not finished), and the
	// command is still there.
	n0, _ := shimtest.ReadStream(dir, "stdout")
	time.Sleep(700 * time.Millisecond)
	n1, _ := shimtest.ReadStream(dir, "stdout")
	if len(n1) >= size {
		t.Fatalf("journal holds %d bytes on a 2 MiB disk", len(n1))
	}
	if len(n1) != len(n0) {
		t.Errorf("journal grew from %d to %d bytes on a full disk", len(n0), len(n1))
	}
	if !bytes.Equal(n1, want[:len(n1)]) {
		t.Fatalf("journal prefix (%d bytes) differs from the written bytes", len(n1))
	}
	if e, _ := shimtest.ReadStream(dir, "stderr"); len(e) != 0 {
		t.Fatalf("stderr %q: the command got past its output on a full disk (bytes were dropped)", e)
	}
	st, err := c.Status(shimtest.CtxT(t, 5*time.Second))
	if err != nil || st.State != sessiondir.StateRunning || st.WriteError == "" {
		t.Fatalf("after 700ms of a full disk: got %+v %v, want running with write_error", st, err)
	}
	if ps := processState(st.PID); ps == "" || ps == "Z" {
		t.Fatalf("command %d: state %q, want alive (blocked)", st.PID, ps)
	}

	remountSize(t, mnt, "64m")
	e := shimtest.WaitExit(t, dir)
	if e.Reason != journal.ReasonExited || e.Code != 7 {
		t.Fatalf("exit: got %+v, want exited 7", e)
	}
	got, err := shimtest.ReadStream(dir, "stdout")
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
	if b, _ := shimtest.ReadStream(dir, "stderr"); string(b) != "done\n" {
		t.Errorf("stderr: got %q, want %q", b, "done\n")
	}
	st, err = c.Status(shimtest.CtxT(t, 5*time.Second))
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
	shimtest.NeedRoot(t)
	t.Parallel()
	mnt := tmpfsDir(t, "4m")
	dir := filepath.Join(mnt, "s")
	shimtest.StartAt(t, dir, sessiondir.Spec{Argv: []string{"sh", "-c", `echo ready; read x; echo "bye $x"; exit 4`}, Dir: "/"})
	waitOutput(t, dir, "ready\n")
	c := shimtest.Dial(t, dir)

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
		r.err = sessiondir.Attach(shimtest.CtxT(t, 30*time.Second), dir, sessiondir.AttachOptions{}, func(b []byte) error {
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

	// Without its reserve, as a journal recovered after its writer
	// crashed is: with it, the exit record is written on a full disk
	// (TestFinishFullDisk, daemon's TestDiskFullFlood).
	if err := os.Remove(filepath.Join(dir, sessiondir.JournalDir, journal.ReserveFile)); err != nil {
		t.Fatal(err)
	}
	fillDisk(t, mnt)
	if err := c.WriteStdin(shimtest.CtxT(t, 5*time.Second), []byte("now\n")); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, c, "write_error", func(st sessiondir.Status) bool { return st.WriteError != "" })
	// For a while: running (from the shim and from disk), never lost.
	deadline := time.Now().Add(1500 * time.Millisecond)
	for time.Now().Before(deadline) {
		ds, err := sessiondir.ReadStatus(dir)
		if err != nil {
			t.Fatal(err)
		}
		if ds.State != sessiondir.StateRunning {
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
	e := shimtest.WaitExit(t, dir)
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

// writerEnv makes the test binary a command for TestDiskFullPastDrainWindow:
// it prints "go", waits for a line on stdin, enlarges its stdout pipe to
// 1 MiB, writes the named file to it in one write, and exits 3, so its
// output waits in the pipe after it exited.
const writerEnv = "RUNNER_SHIM_TEST_WRITER"

func init() {
	if src := os.Getenv(writerEnv); src != "" {
		os.Exit(writerHelper(src))
	}
}

func writerHelper(src string) int {
	b, err := os.ReadFile(src)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	os.Stdout.WriteString("go\n")
	os.Stdin.Read(make([]byte, 1))
	if _, err := unix.FcntlInt(1, unix.F_SETPIPE_SZ, 1<<20); err != nil {
		fmt.Fprintln(os.Stderr, "F_SETPIPE_SZ:", err)
		return 1
	}
	if _, err := os.Stdout.Write(b); err != nil {
		return 1
	}
	return 3
}

// TestDiskFullPastDrainWindow: the command exits while its last bytes
// wait in the pipe and the disk stays full for longer than DrainGrace.
// The drain window is for leftover holders of the pipe, not for a journal
// that cannot be written: once space is back every byte is in the journal
// before the exit record.
func TestDiskFullPastDrainWindow(t *testing.T) {
	shimtest.NeedRoot(t)
	// "at once" frees all the space; "trickle" frees a little first, so the
	// disk is full again after a few writes.
	for _, trickle := range []bool{false, true} {
		name := map[bool]string{false: "at once", true: "trickle"}[trickle]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testDiskFullPastDrainWindow(t, trickle)
		})
	}
}

func testDiskFullPastDrainWindow(t *testing.T, trickle bool) {
	const size = 512 << 10 // fits in the command's enlarged pipe: it exits at once
	want, src := patternFile(t, size)
	mnt := tmpfsDir(t, "2m")
	dir := filepath.Join(mnt, "s")
	shimtest.StartAt(t, dir, sessiondir.Spec{Argv: []string{shimtest.ShimExe[0]}, Dir: "/",
		Env: append([]string{writerEnv + "=" + src, "GORACE=atexit_sleep_ms=0"}, shimtest.TestEnv...)})
	waitOutput(t, dir, "go\n")
	c := shimtest.Dial(t, dir)
	fillDisk(t, mnt)
	if err := c.WriteStdin(shimtest.CtxT(t, 5*time.Second), []byte("\n")); err != nil {
		t.Fatal(err)
	}
	st := waitStatus(t, c, "write_error", func(st sessiondir.Status) bool { return st.WriteError != "" })
	// The command exits with its output in the pipe.
	deadline := time.Now().Add(5 * time.Second)
	for ps := processState(st.PID); ps != "" && ps != "Z"; ps = processState(st.PID) {
		if time.Now().After(deadline) {
			t.Fatalf("command %d did not exit with its output buffered (state %s)", st.PID, ps)
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(DrainGrace + 500*time.Millisecond)
	if st, err := c.Status(shimtest.CtxT(t, 5*time.Second)); err != nil || st.State != sessiondir.StateRunning || st.WriteError == "" {
		t.Fatalf("disk still full after the drain window: got %+v %v, want running with write_error", st, err)
	}
	filler := filepath.Join(mnt, "filler")
	if trickle {
		// Room for a few reads only: the shim (retrying every 2 s at most
		// by now) writes them, then finds the disk full again.
		fi, err := os.Stat(filler)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(filler, fi.Size()-160<<10); err != nil {
			t.Fatal(err)
		}
		time.Sleep(maxBackoff + 500*time.Millisecond)
		if l, _ := shimtest.ReadStream(dir, "stdout"); len(l) <= 3 {
			t.Fatalf("the shim wrote nothing into 160 KiB of free space (journal %d bytes)", len(l))
		}
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	e := shimtest.WaitExit(t, dir)
	if e.Reason != journal.ReasonExited || e.Code != 3 {
		t.Fatalf("exit: got %+v, want exited 3", e)
	}
	got, _ := shimtest.ReadStream(dir, "stdout")
	if !bytes.Equal(got, append([]byte("go\n"), want...)) {
		t.Fatalf("stdout: got %d bytes, want exactly the %d written", len(got), size+3)
	}
}

// TestRunAsUser: Spec.User runs the command as another user (by name and
// as uid:gid) while the session's files stay the daemon's.
func TestRunAsUser(t *testing.T) {
	shimtest.NeedRoot(t)
	u, err := user.Lookup("nobody")
	if err != nil {
		t.Skipf("SKIPPED: no user nobody: %v", err)
	}
	tests := []struct {
		name, user, want string
	}{
		{"name", "nobody", u.Uid + "\n" + u.Gid + "\n"},
		{"uid:gid", u.Uid + ":" + u.Gid, u.Uid + "\n" + u.Gid + "\n" + u.Gid + "\n"},
		{"uid", u.Uid, u.Uid + "\n" + u.Gid + "\n" + u.Gid + "\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			argv := []string{"sh", "-c", "id -u; id -g"}
			if tt.name != "name" {
				argv = []string{"sh", "-c", "id -u; id -g; id -G"} // no supplementary groups
			}
			dir, _ := shimtest.Start(t, sessiondir.Spec{Argv: argv, User: tt.user, Dir: "/"})
			e := shimtest.WaitExit(t, dir)
			out, _ := shimtest.ReadStream(dir, "stdout")
			errb, _ := shimtest.ReadStream(dir, "stderr")
			if e.Code != 0 || string(out) != tt.want {
				t.Fatalf("got exit %+v stdout %q stderr %q, want exit 0 and %q", e, out, errb, tt.want)
			}
			// The daemon (root) keeps the session: its files are root's,
			// and it reads them.
			for _, p := range []string{dir, filepath.Join(dir, sessiondir.JournalDir), filepath.Join(dir, sessiondir.JournalDir, "stdout")} {
				var st unix.Stat_t
				if err := unix.Stat(p, &st); err != nil {
					t.Fatal(err)
				}
				if st.Uid != 0 {
					t.Errorf("%s: owner %d, want root", p, st.Uid)
				}
			}
			if ds, err := sessiondir.ReadStatus(dir); err != nil || ds.State != sessiondir.StateExited {
				t.Errorf("ReadStatus: got %+v %v, want exited", ds, err)
			}
		})
	}
	t.Run("socket owner", func(t *testing.T) {
		t.Parallel()
		dir, _ := shimtest.Start(t, sessiondir.Spec{Argv: []string{"sleep", "30"}, User: "nobody", Dir: "/"})
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(dir, sessiondir.SocketFile), &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid != 0 {
			t.Errorf("ctl.sock owner %d, want root", st.Uid)
		}
		c := shimtest.Dial(t, dir)
		s, err := c.Status(shimtest.CtxT(t, 5*time.Second))
		if err != nil || s.State != sessiondir.StateRunning {
			t.Fatalf("status: got %+v %v", s, err)
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.PID))
		if err != nil {
			t.Fatal(err)
		}
		if want := "Uid:\t" + u.Uid + "\t" + u.Uid; !strings.Contains(string(b), want) {
			t.Errorf("command %d runs as %q, want %s", s.PID, grepLine(string(b), "Uid:"), want)
		}
	})
	t.Run("unknown user", func(t *testing.T) {
		t.Parallel()
		dir := shimtest.SessionDir(t)
		_, err := shimtest.ColdStart(shimtest.CtxT(t, 10*time.Second), shimtest.ShimExe, dir, sessiondir.Spec{ID: "x", Argv: []string{"true"}, Env: shimtest.TestEnv, User: "no-such-user-zz"})
		var se *launch.StartError
		if !errors.As(err, &se) || !strings.Contains(err.Error(), "no-such-user-zz") {
			t.Fatalf("got %v, want a StartError naming the user", err)
		}
		shimtest.WaitGone(t, se.ShimPID)
		if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("session dir left behind: %v", err)
		}
	})
}

func grepLine(s, prefix string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}

func nsLink(t *testing.T, path string) string {
	t.Helper()
	l, err := os.Readlink(path)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestNetNS: Spec.NetNS starts the command in that namespace; the shim
// itself, and a later session without NetNS, stay in the host's.
func TestNetNS(t *testing.T) {
	shimtest.NeedRoot(t)
	nsPath, ino := shimtest.NewNetNS(t)
	host := nsLink(t, "/proc/self/ns/net")
	want := fmt.Sprintf("net:[%d]", ino)
	if want == host {
		t.Fatalf("the new namespace %s is the host's", want)
	}

	dir, st := shimtest.Start(t, sessiondir.Spec{Argv: []string{"sh", "-c", "readlink /proc/self/ns/net; read x; exit 0"}, NetNS: nsPath})
	waitOutput(t, dir, want+"\n")
	// Every thread of the shim is back in the host namespace (restored, or
	// the thread was discarded).
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", st.ShimPID))
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		l, err := os.Readlink(fmt.Sprintf("/proc/%d/task/%s/ns/net", st.ShimPID, task.Name()))
		if err != nil {
			continue // the thread ended meanwhile
		}
		if l != host {
			t.Errorf("shim thread %s is in %s, want the host's %s", task.Name(), l, host)
		}
	}
	c := shimtest.Dial(t, dir)
	if err := c.CloseStdin(shimtest.CtxT(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if e := shimtest.WaitExit(t, dir); e.Code != 0 {
		t.Fatalf("exit: got %+v, want 0", e)
	}

	dir2, _ := shimtest.Start(t, sessiondir.Spec{Argv: []string{"readlink", "/proc/self/ns/net"}})
	shimtest.WaitExit(t, dir2)
	if out, _ := shimtest.ReadStream(dir2, "stdout"); string(out) != host+"\n" {
		t.Errorf("a session without NetNS: got %q, want the host's %q", out, host)
	}

	t.Run("missing", func(t *testing.T) {
		dir := shimtest.SessionDir(t)
		_, err := shimtest.ColdStart(shimtest.CtxT(t, 10*time.Second), shimtest.ShimExe, dir, sessiondir.Spec{ID: "x", Argv: []string{"true"}, Env: shimtest.TestEnv, NetNS: "/nonexistent/netns"})
		var se *launch.StartError
		if !errors.As(err, &se) || !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("got %v, want a StartError matching fs.ErrNotExist", err)
		}
		shimtest.WaitGone(t, se.ShimPID)
	})
	t.Run("not a namespace", func(t *testing.T) {
		dir := shimtest.SessionDir(t)
		notNS := filepath.Join(t.TempDir(), "plain")
		os.WriteFile(notNS, nil, 0o600)
		_, err := shimtest.ColdStart(shimtest.CtxT(t, 10*time.Second), shimtest.ShimExe, dir, sessiondir.Spec{ID: "x", Argv: []string{"true"}, Env: shimtest.TestEnv, NetNS: notNS})
		var se *launch.StartError
		if !errors.As(err, &se) || !errors.Is(err, syscall.EINVAL) {
			t.Fatalf("got %v, want a StartError matching EINVAL", err)
		}
		shimtest.WaitGone(t, se.ShimPID)
	})
}

// TestOutputClosedEarly: a command that closes stdout and stderr but keeps
// running is still running: the session ends with the command's exit, not
// with its output streams, and the exit is the true one.
func TestOutputClosedEarly(t *testing.T) {
	t.Parallel()
	dir, _ := shimtest.Start(t, sessiondir.Spec{Argv: []string{"sh", "-c", `echo out; echo err >&2; exec >&- 2>&-; read x; exit 6`}})
	waitOutput(t, dir, "out\n")
	c := shimtest.Dial(t, dir)
	// Well past the drain window: still running, stdin still works.
	time.Sleep(DrainGrace + 300*time.Millisecond)
	if st, err := c.Status(shimtest.CtxT(t, 5*time.Second)); err != nil || st.State != sessiondir.StateRunning {
		t.Fatalf("after the command closed its output: got %+v %v, want running", st, err)
	}
	if err := c.WriteStdin(shimtest.CtxT(t, 5*time.Second), []byte("go\n")); err != nil {
		t.Fatal(err)
	}
	e := shimtest.WaitExit(t, dir)
	if e.Reason != journal.ReasonExited || e.Code != 6 {
		t.Fatalf("exit: got %+v, want exited 6", e)
	}
	if e.Lengths["stdout"] != 4 || e.Lengths["stderr"] != 4 {
		t.Errorf("lengths: got %v, want 4 and 4", e.Lengths)
	}
}

// TestGrandchildHoldsOutput pins the documented drain window: when a
// grandchild keeps stdout open after the command exited, the exit record
// comes DrainGrace after the exit (not before, not never), with the true
// code and the bytes written before the window closed; the shim does not
// kill the grandchild, whose later writes fail with EPIPE.
func TestGrandchildHoldsOutput(t *testing.T) {
	t.Parallel()
	rcFile := filepath.Join(t.TempDir(), "rc")
	// The grandchild ignores SIGPIPE so that its late write reports the
	// error instead of killing it.
	script := `(trap '' PIPE; sleep 3; echo late; echo "rc=$?" >"$0") & echo "gc $!"; exit 2`
	dir, st := shimtest.Start(t, sessiondir.Spec{Argv: []string{"sh", "-c", script, rcFile}})
	t0 := st.StartedAt // the command exits at once
	waitOutput(t, dir, "gc ")
	var gc int
	if b, _ := shimtest.ReadStream(dir, "stdout"); len(b) > 0 {
		fmt.Sscanf(string(b), "gc %d", &gc)
	}
	if gc == 0 {
		t.Fatal("no grandchild pid")
	}
	t.Cleanup(func() { syscall.Kill(gc, syscall.SIGKILL) }) // the grandchild this test started
	e := shimtest.WaitExit(t, dir)
	took := time.Since(t0)
	if e.Reason != journal.ReasonExited || e.Code != 2 {
		t.Fatalf("exit: got %+v, want exited 2", e)
	}
	if took < DrainGrace-200*time.Millisecond || took > DrainGrace+2*time.Second {
		t.Errorf("exit record after %v, want about DrainGrace (%v) after the exit", took, DrainGrace)
	}
	if err := syscall.Kill(gc, 0); err != nil {
		t.Errorf("grandchild %d after the exit record: %v, want still running (the shim does not kill leftovers)", gc, err)
	}
	out, _ := shimtest.ReadStream(dir, "stdout")
	if want := fmt.Sprintf("gc %d\n", gc); string(out) != want {
		t.Errorf("stdout: got %q, want %q", out, want)
	}
	// The grandchild's late write hits a closed pipe.
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, err := os.ReadFile(rcFile)
		if err == nil && len(b) > 0 {
			if got := strings.TrimSpace(string(b)); got == "rc=0" {
				t.Errorf("grandchild's late write: got %s, want a failure (EPIPE)", got)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the grandchild never reported its late write")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if e2 := shimtest.WaitExit(t, dir); e2.Lengths["stdout"] != int64(len(out)) {
		t.Errorf("the journal grew after the exit record: %v vs %d", e2.Lengths, len(out))
	}
}

// TestCommandClosesStdin: a command that closes its own stdin and keeps
// running answers writes with ErrStdinClosed (which matches ErrExited),
// promptly, while control still sees it running.
func TestCommandClosesStdin(t *testing.T) {
	t.Parallel()
	dir, _ := shimtest.Start(t, sessiondir.Spec{Argv: []string{"sh", "-c", `exec <&-; echo closed; sleep 30`}})
	waitOutput(t, dir, "closed\n")
	c := shimtest.Dial(t, dir)
	ctx := shimtest.CtxT(t, 5*time.Second)
	t0 := time.Now()
	err := c.WriteStdin(ctx, []byte("x"))
	if !errors.Is(err, sessiondir.ErrStdinClosed) || !errors.Is(err, sessiondir.ErrExited) {
		t.Fatalf("write to a closed stdin: got %v, want ErrStdinClosed", err)
	}
	if took := time.Since(t0); took > 2*time.Second {
		t.Errorf("write took %v", took)
	}
	if st, err := c.Status(ctx); err != nil || st.State != sessiondir.StateRunning {
		t.Fatalf("status: got %+v %v, want running", st, err)
	}
	e, err := c.Terminate(ctx, time.Second)
	if err != nil || e.Reason != journal.ReasonSignaled || e.Signal != int(syscall.SIGTERM) {
		t.Fatalf("terminate: got %+v %v, want signaled TERM", e, err)
	}
}

// TestStdinLarge: stdin is total: a write larger than one request
// (several MiB, binary) reaches the command byte for byte, and
// close-stdin after it ends the command.
func TestStdinLarge(t *testing.T) {
	t.Parallel()
	want := pattern(3<<20 + 12345)
	dir, _ := shimtest.Start(t, sessiondir.Spec{Argv: []string{"cat"}})
	c := shimtest.Dial(t, dir)
	ctx := shimtest.CtxT(t, 20*time.Second)
	if err := c.WriteStdin(ctx, want); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseStdin(ctx); err != nil {
		t.Fatal(err)
	}
	if e := shimtest.WaitExit(t, dir); e.Code != 0 || e.Lengths["stdout"] != int64(len(want)) {
		t.Fatalf("exit: got %+v, want 0 with %d bytes", e, len(want))
	}
	got, err := shimtest.ReadStream(dir, "stdout")
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("stdout: got %d bytes (%v), want the %d written", len(got), err, len(want))
	}
}
