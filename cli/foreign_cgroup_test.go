package cli

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/cgroups/v3"

	"github.com/agentrunner/runner/internal/runnerdtest"
	"github.com/agentrunner/runner/internal/testcap"
)

// unprivUID is the uid the unprivileged runnerd of
// TestUnprivilegedAfterRootRunnerd runs as: no user of this host has it.
const unprivUID = 48_731

// TestUnprivilegedAfterRootRunnerd is issue #35's item 5. A root runnerd
// and then an unprivileged one run from the same login, so in the same
// cgroup, and with the default --cgroup-root both name ITS_CGROUP/runner,
// which the root runnerd created and owns. The unprivileged one used to
// take that directory's existence as proof that it could make cgroups:
// it advertised limits, failed every create with "mkdir .../runner/u1:
// permission denied", and warned that the root runnerd's live sandboxes
// were its own leftovers to "remove by hand". It must see that the root
// is not its own, run without cgroups (saying so), and serve.
//
// The login's cgroup is played by a fresh cgroup T the test makes at the
// top of each v1 hierarchy runnerd uses; both runnerds are placed in it
// before they run any code of their own.
func TestUnprivilegedAfterRootRunnerd(t *testing.T) {
	testcap.Root(t, "the test runs a root runnerd and a runnerd as another uid")
	if cgroups.Mode() != cgroups.Legacy && cgroups.Mode() != cgroups.Hybrid {
		t.Skip("SKIP: the test places runnerds in v1 hierarchies; this host has none (under v2 the unprivileged runnerd cannot write the root's cgroup.subtree_control and says so)")
	}
	var rnd [6]byte
	rand.Read(rnd[:])
	login := "runner-login-" + hex.EncodeToString(rnd[:])
	var loginDirs []string
	for _, h := range []string{"memory", "pids", "cpu", "cpuacct", "freezer"} {
		d := filepath.Join("/sys/fs/cgroup", h, login)
		if _, err := os.Stat(filepath.Dir(d)); err != nil {
			continue
		}
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		loginDirs = append(loginDirs, d)
	}
	t.Cleanup(func() { removeCgroupTrees(t, loginDirs) })

	// Binaries the unprivileged uid can run: binDir is root's alone.
	pub, err := os.MkdirTemp("", "runner-foreign-bin-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(pub) })
	if err := os.Chmod(pub, 0o755); err != nil {
		t.Fatal(err)
	}
	runnerd := filepath.Join(pub, "runnerd")
	copyFile(t, filepath.Join(binDir, "runnerd"), runnerd, 0o755)
	// The root runnerd goes through runnerdtest, which runs a binary:
	// this one moves itself into T, then becomes runnerd.
	var place strings.Builder
	for _, d := range loginDirs {
		fmt.Fprintf(&place, "echo $$ > %s/cgroup.procs || exit 97\n", d)
	}
	wrapper := filepath.Join(pub, "runnerd-in-login")
	if err := os.WriteFile(wrapper, []byte("#!/bin/sh\n"+place.String()+"exec "+runnerd+` "$@"`+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}

	// The root runnerd: cgroups on, the default root (T/runner).
	root := runnerdtest.Start(t, wrapper, "--netpolicy", "off", "--cgroups", "auto")
	t.Cleanup(root.Stop)
	rootEnv := cliEnv("RUNNERD_URL="+root.URL(), "RUNNERD_STATE="+root.State)
	mustCLI(t, rootEnv, "create", "r1")
	t.Cleanup(func() { runCLIEnv(rootEnv, nil, "rm", "r1") })
	r1 := filepath.Join(loginDirs[0], "runner", "r1")
	if _, err := os.Stat(r1); err != nil {
		t.Fatalf("the root runnerd's sandbox has no cgroup: %v\n%s", err, root.LogTail())
	}
	mustCLI(t, rootEnv, "spawn", "r1", "--id", "live", "--", "sleep", "600")
	if n := cgroupProcs(r1); n == 0 {
		t.Fatalf("the root runnerd's session is not in its sandbox's cgroup %s", r1)
	}

	// The unprivileged runnerd, same cgroup, its own state directory,
	// every flag at its default but where it listens.
	state, err := os.MkdirTemp("", "runnerd-unpriv-state-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(state) })
	t.Cleanup(func() { os.RemoveAll(filepath.Join(os.TempDir(), fmt.Sprintf("runnerd-%d", unprivUID))) })
	if err := os.Chown(state, unprivUID, unprivUID); err != nil {
		t.Fatal(err)
	}
	u := startUnprivileged(t, runnerd, state, loginDirs)
	env := cliEnv("RUNNERD_URL=http://"+u.addr, "RUNNERD_STATE="+state)
	if o, e, code := runCLIEnv(env, nil, "create", "u1"); code != 0 {
		t.Fatalf("unprivileged runnerd: create u1: exit %d, want 0\nstdout: %s\nstderr: %s\nlog:\n%s", code, o, e, u.log.String())
	}
	if o, e, code := runCLIEnv(env, nil, "exec", "u1", "--", "true"); code != 0 {
		t.Fatalf("unprivileged runnerd: exec u1 -- true: exit %d, want 0\nstdout: %s\nstderr: %s\nlog:\n%s", code, o, e, u.log.String())
	}
	runCLIEnv(env, nil, "rm", "u1")
	log := u.log.String()
	if strings.Contains(log, "remove it by hand") {
		t.Errorf("the unprivileged runnerd's log tells to remove the root runnerd's cgroups by hand:\n%s", log)
	}
	if !strings.Contains(log, "resource limits not enforced") || !strings.Contains(log, "belongs to uid 0") {
		t.Errorf("the unprivileged runnerd's log does not say that cgroups are off because the root is another's:\n%s", log)
	}
	// The root runnerd's sandbox is untouched.
	if _, err := os.Stat(r1); err != nil {
		t.Errorf("the root runnerd's sandbox cgroup: %v", err)
	}
	if n := cgroupProcs(r1); n == 0 {
		t.Errorf("the root runnerd's session left its sandbox's cgroup %s", r1)
	}
	if o, e, code := runCLIEnv(rootEnv, nil, "exec", "r1", "--", "true"); code != 0 {
		t.Errorf("root runnerd: exec r1 -- true: exit %d, want 0\nstdout: %s\nstderr: %s", code, o, e)
	}
}

// mustCLI runs runner with env and fails t unless it exits 0.
func mustCLI(t *testing.T, env []string, args ...string) string {
	t.Helper()
	o, e, code := runCLIEnv(env, nil, args...)
	if code != 0 {
		t.Fatalf("runner %s: exit %d, want 0; stderr: %s", strings.Join(args, " "), code, e)
	}
	return string(o)
}

// unprivDaemon is a runnerd running as unprivUID.
type unprivDaemon struct {
	addr string
	log  *syncBuffer
}

// startUnprivileged starts runnerd as unprivUID on state, placed in dirs
// (cgroup directories, one per hierarchy) before it runs: a shell waits on
// stdin, is placed, is released and execs runnerd (the same pid). It
// returns once runnerd serves; cleanup stops it and the shims it started.
func startUnprivileged(t *testing.T, bin, state string, dirs []string) *unprivDaemon {
	t.Helper()
	d := &unprivDaemon{log: &syncBuffer{}}
	cmd := exec.Command("sh", "-c", `read x; exec "$@"`, "sh", bin, "--state", state, "--listen", "127.0.0.1:0")
	cmd.Env = append(cliEnv("HOME="+state), "RUNNERD_TOKEN=")
	cmd.Dir = state
	cmd.Stdout, cmd.Stderr = d.log, d.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: unprivUID, Gid: unprivUID}}
	release, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		runnerdtest.KillShims(state)
	})
	for _, dir := range dirs {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
			t.Fatal(err)
		}
	}
	release.Write([]byte("\n"))
	release.Close()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if m := tcpRe.FindStringSubmatch(d.log.String()); m != nil {
			d.addr = m[1]
			return d
		}
		select {
		case <-done:
			t.Fatalf("unprivileged runnerd exited: %v\n%s", cmd.ProcessState, d.log.String())
		default:
		}
	}
	t.Fatalf("unprivileged runnerd did not serve in 20 s:\n%s", d.log.String())
	return nil
}

// removeCgroupTrees removes each directory of dirs with its children,
// deepest first, retrying while the last processes leave.
func removeCgroupTrees(t *testing.T, dirs []string) {
	t.Helper()
	for _, top := range dirs {
		var all []string
		filepath.WalkDir(top, func(p string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				all = append(all, p)
			}
			return nil
		})
		for i := len(all) - 1; i >= 0; i-- {
			var err error
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
				if err = os.Remove(all[i]); err == nil || os.IsNotExist(err) {
					err = nil
					break
				}
			}
			if err != nil {
				procs, _ := os.ReadFile(filepath.Join(all[i], "cgroup.procs"))
				t.Errorf("remove cgroup %s: %v (processes: %q)", all[i], err, procs)
			}
		}
	}
}

// copyFile copies src to dst with mode.
func copyFile(t *testing.T, src, dst string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, mode); err != nil {
		t.Fatal(err)
	}
}

// cgroupProcs counts the processes in the cgroup dir and its children.
func cgroupProcs(dir string) int {
	n := 0
	filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
		if err == nil && e.Name() == "cgroup.procs" {
			b, _ := os.ReadFile(p)
			n += len(strings.Fields(string(b)))
		}
		return nil
	})
	return n
}
