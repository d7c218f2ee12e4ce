package standin_test

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/agentrunner/runner/adapter/internal/standin"
)

// startTagged starts sleep with env appended and returns it; its waiter
// is the test's (Wait in cleanup or by the caller).
func startTagged(t *testing.T, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	cmd.Env = append(os.Environ(), env...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

// TestKillTaggedKillsOnlyTheExactTag: the tagged process and its child
// (which inherits the tag) die; processes whose tag only shares a prefix
// or a suffix with it, or whose variable name merely ends in it, live.
func TestKillTaggedKillsOnlyTheExactTag(t *testing.T) {
	const name = "STANDINTEST_SANDBOX"
	tagged := startTagged(t, name+"=sb1")
	// A child of a tagged shell: found by the tag it inherited, not by parentage.
	sh := exec.Command("sh", "-c", "sleep 60 & echo $!; wait")
	sh.Env = append(os.Environ(), name+"=sb1")
	out, err := sh.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sh.Process.Kill(); sh.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	var grandchild int
	if _, err := fmt.Sscan(strings.TrimSpace(line), &grandchild); err != nil {
		t.Fatal(err)
	}
	others := []*exec.Cmd{
		startTagged(t, name+"=sb10"),
		startTagged(t, name+"=xsb1"),
		startTagged(t, "X"+name+"=sb1"),
		startTagged(t),
	}

	standin.KillTagged(name, "sb1")

	for _, c := range []*exec.Cmd{tagged, sh} {
		err := c.Wait()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Errorf("%v: got %v, want killed by SIGKILL", c.Args, err)
		}
	}
	// The grandchild was reparented; it is gone or a zombie awaiting init.
	deadline := time.Now().Add(5 * time.Second)
	for alive(grandchild) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if alive(grandchild) {
		t.Errorf("the tagged grandchild %d survived", grandchild)
	}
	// Signal 0 would succeed on an unreaped zombie; /proc's state does not.
	for _, c := range others {
		if !alive(c.Process.Pid) {
			t.Errorf("%v with env %q was killed", c.Args, c.Env[len(c.Env)-1])
		}
	}
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	return err == nil && !strings.Contains(string(st), ") Z ")
}

// TestOpenPTY: bytes written to the slave come out of the master (with the
// line discipline's CRLF), and the size asked for is the size set.
func TestOpenPTY(t *testing.T) {
	master, slave, err := standin.OpenPTY(31, 97)
	if err != nil {
		t.Fatal(err)
	}
	defer master.Close()
	defer slave.Close()
	if got := winsize(t, slave); got != [2]uint16{31, 97} {
		t.Fatalf("size: got rows,cols %v, want [31 97]", got)
	}
	if _, err := slave.Write([]byte("hi\n")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	master.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := master.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(buf[:n]); got != "hi\r\n" {
		t.Fatalf("read from master: got %q, want %q", got, "hi\r\n")
	}
	if err := standin.SetPTYSize(master, 5, 7); err != nil {
		t.Fatal(err)
	}
	if got := winsize(t, slave); got != [2]uint16{5, 7} {
		t.Fatalf("resized: got rows,cols %v, want [5 7]", got)
	}
}

func winsize(t *testing.T, f *os.File) [2]uint16 {
	t.Helper()
	var ws struct{ rows, cols, x, y uint16 }
	rc, err := f.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var errno syscall.Errno
	rc.Control(func(fd uintptr) {
		_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCGWINSZ, uintptr(unsafe.Pointer(&ws)))
	})
	if errno != 0 {
		t.Fatalf("TIOCGWINSZ: %v", errno)
	}
	return [2]uint16{ws.rows, ws.cols}
}

// procState is the state letter of /proc/pid/stat ("S", "T", "Z").
func procState(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	return rest[:1]
}

// TestStopAndContinueTagged: StopTagged freezes every process of the tag
// (a paused VM) and only those; ContinueTagged lets them run again.
func TestStopAndContinueTagged(t *testing.T) {
	const name = "STANDINTEST_PAUSE"
	tagged, other := startTagged(t, name+"=sb1"), startTagged(t, name+"=sb2")
	standin.StopTagged(name, "sb1")
	if got := procState(t, tagged.Process.Pid); got != "T" {
		t.Errorf("tagged process after StopTagged: state %s, want T (stopped)", got)
	}
	if got := procState(t, other.Process.Pid); got == "T" {
		t.Errorf("a process of another tag was stopped")
	}
	standin.ContinueTagged(name, "sb1")
	deadline := time.Now().Add(5 * time.Second)
	for procState(t, tagged.Process.Pid) == "T" {
		if time.Now().After(deadline) {
			t.Fatal("tagged process still stopped after ContinueTagged")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
