package pod

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// mountsMentioning returns the lines of the host's mount table that name
// dir.
func mountsMentioning(t *testing.T, dir string) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, dir) {
			out = append(out, l)
		}
	}
	return out
}

// TestDestroy: Destroy ends the holder and every process of the pod,
// leaves no mount on the host, and is idempotent; Adopt then says the
// holder is gone.
func TestDestroy(t *testing.T) {
	cfg := newConfig(t, "destroy", 10)
	p, err := Create(ctxT(t, 30*time.Second), cfg)
	if err != nil {
		t.Fatal(err)
	}
	// A process in the pod that is not the holder's child: nsenter's
	// forked sleep, whose parent is nsenter, outside.
	sleeper := exec.Command("nsenter", "-t", strconv.Itoa(p.PID()), "-U", "-m", "-p", "-i", "-u", "-S", "0", "-G", "0", "--wdns=/", "/bin/sleep", "600")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	waitErr := make(chan error, 1)
	go func() { waitErr <- sleeper.Wait() }() // owned by the test: it ends with the pod
	var sleepPID int
	for deadline := time.Now().Add(10 * time.Second); sleepPID == 0 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(sleeper.Process.Pid) + "/task/" + strconv.Itoa(sleeper.Process.Pid) + "/children")
		sleepPID, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	if sleepPID == 0 {
		t.Fatal("no sleep in the pod")
	}
	if m := mountsMentioning(t, cfg.Upper); len(m) != 0 {
		t.Errorf("the host's mount table names the upper directory while the pod runs: %q", m)
	}
	if err := p.Destroy(ctxT(t, 30*time.Second)); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	for _, pid := range []int{p.PID(), sleepPID} {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("pid %d after Destroy: kill -0 got %v, want ESRCH", pid, err)
		}
	}
	select {
	case err := <-waitErr:
		if err == nil {
			t.Errorf("nsenter's sleep: exited 0, want killed with the pod")
		}
	case <-time.After(10 * time.Second):
		t.Errorf("nsenter's sleep still runs after Destroy")
	}
	if m := mountsMentioning(t, cfg.Upper); len(m) != 0 {
		t.Errorf("the host's mount table after Destroy: %q", m)
	}
	if err := p.Destroy(ctxT(t, 5*time.Second)); err != nil {
		t.Errorf("second Destroy: %v, want nil", err)
	}
	if _, err := Adopt(p.PID(), p.StartTime()); !errors.Is(err, ErrGone) {
		t.Errorf("Adopt after Destroy: got %v, want ErrGone", err)
	}
}

// TestAdopt: a holder is found again by pid and start time (another
// start time is ErrGone), and an adopted pod's Destroy ends it.
func TestAdopt(t *testing.T) {
	cfg := newConfig(t, "adopt", 11)
	p := create(t, cfg)
	if _, err := Adopt(p.PID(), p.StartTime()+1); !errors.Is(err, ErrGone) {
		t.Errorf("Adopt with another start time: got %v, want ErrGone", err)
	}
	a, err := Adopt(p.PID(), p.StartTime())
	if err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	if out, err := inPod(t, a, "hostname"); err != nil || out != "adopt\n" {
		t.Fatalf("in the adopted pod: %q %v", out, err)
	}
	// The adopted handle kills; the creator's (the parent) reaps, as
	// runnerd's restarted self would leave it to the holder's new parent.
	if err := a.Destroy(ctxT(t, 30*time.Second)); err != nil {
		t.Fatalf("adopted Destroy: %v", err)
	}
	if err := p.Destroy(ctxT(t, 30*time.Second)); err != nil {
		t.Fatalf("creator's Destroy: %v", err)
	}
	if err := syscall.Kill(p.PID(), 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("holder after Destroy: %v, want ESRCH", err)
	}
}

// TestCreateInvalid: a Config Create cannot hold is ErrInvalid, and
// nothing is started.
func TestCreateInvalid(t *testing.T) {
	good := newConfig(t, "ok", 12)
	for _, tc := range []struct {
		name string
		edit func(*Config)
	}{
		{"bad host name", func(c *Config) { c.Name = "a b" }},
		{"zero block", func(c *Config) { c.UIDBase = 0 }},
		{"relative upper", func(c *Config) { c.Upper = "upper" }},
		{"system dir with a comma", func(c *Config) { c.SystemDirs = []string{"/usr,lowerdir=/root"} }},
		{"system dir /", func(c *Config) { c.SystemDirs = []string{"/"} }},
		{"upper not a directory", func(c *Config) { c.Upper = "/dev/null" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := good
			tc.edit(&c)
			if p, err := Create(ctxT(t, 10*time.Second), c); !errors.Is(err, ErrInvalid) {
				if p != nil {
					p.Destroy(ctxT(t, 10*time.Second))
				}
				t.Errorf("got %v, want ErrInvalid", err)
			}
		})
	}
}

// TestCreateFailureLeavesNothing: a holder that fails to build its pod
// (here: the root overlay's layer directory is a file) reports the failed
// step, and is killed and reaped.
func TestCreateFailureLeavesNothing(t *testing.T) {
	cfg := newConfig(t, "fail", 13)
	cfg.SystemDirs = []string{"/no-such-dir-for-pod-tests"}
	// The upper layer's root directory a file: the root overlay fails.
	if err := os.WriteFile(cfg.Upper+"/root", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := Create(ctxT(t, 30*time.Second), cfg)
	if err == nil {
		p.Destroy(ctxT(t, 10*time.Second))
		t.Fatal("Create succeeded, want the root overlay's failure")
	}
	if !strings.Contains(err.Error(), "mount root overlay") {
		t.Errorf("got %v, want the failed step named", err)
	}
	// No child left: not even a zombie.
	var ws syscall.WaitStatus
	if pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); !errors.Is(err, syscall.ECHILD) {
		t.Errorf("wait4 after the failed Create: pid %d, %v; want ECHILD", pid, err)
	}
}

// TestRelease: Release lets go without ending the pod; Adopt finds it
// again and that handle's Destroy ends it.
func TestRelease(t *testing.T) {
	cfg := newConfig(t, "release", 15)
	p, err := Create(ctxT(t, 30*time.Second), cfg)
	if err != nil {
		t.Fatal(err)
	}
	p.Release()
	p.Release()
	if err := syscall.Kill(p.PID(), 0); err != nil {
		t.Fatalf("holder after Release: %v, want alive", err)
	}
	if err := p.Destroy(ctxT(t, 5*time.Second)); err != nil {
		t.Errorf("Destroy after Release: %v, want nil (nothing done)", err)
	}
	if err := syscall.Kill(p.PID(), 0); err != nil {
		t.Fatalf("holder after a released Pod's Destroy: %v, want alive", err)
	}
	a, err := Adopt(p.PID(), p.StartTime())
	if err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	if err := a.Destroy(ctxT(t, 30*time.Second)); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	// This test is the holder's parent: it reaps it.
	var ws syscall.WaitStatus
	if pid, err := syscall.Wait4(p.PID(), &ws, 0, nil); pid != p.PID() || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Errorf("reap the holder: %d %v %v, want killed by SIGKILL", pid, ws, err)
	}
}
