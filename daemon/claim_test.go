package daemon_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/daemon"
)

// secondRunnerd runs a runnerd on state with args and wants it to refuse
// to start: a non-zero exit within 30 s whose output names every string
// of want.
func secondRunnerd(t *testing.T, state string, want []string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	args = append([]string{"--state", state, "--listen", "none", "--socket", filepath.Join(state, "runnerd.sock"), "--netpolicy", "off"}, args...)
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, runnerdBin, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("the second runnerd did not refuse to start (still running after 30 s): %s", out.String())
	}
	if err == nil {
		t.Fatalf("the second runnerd exited 0: %s", out.String())
	}
	for _, w := range want {
		if !strings.Contains(out.String(), w) {
			t.Errorf("the second runnerd's refusal does not name %q:\n%s", w, out.String())
		}
	}
}

// TestTwoRunnerdsClaims: two real runnerds on one host. With their
// default identity ranges they get disjoint ones (each chosen for its
// state directory and saved there, the same after a restart); a second
// runnerd whose --identity-range overlaps the first's, or whose cgroup
// root is the first's, refuses to start, naming the first (its pid and
// state directory). Before, both ran, handing out the same uids and
// adopting each other's cgroups.
func TestTwoRunnerdsClaims(t *testing.T) {
	claims := t.TempDir()
	root := "claim-test-" + fmt.Sprint(os.Getpid())
	stateA := passableTempDir(t)
	_, pa := startRunnerdProc(t, nil, stateA, "", "--claim-dir", claims, "--cgroup-root", root)
	rangeA, err := os.ReadFile(filepath.Join(stateA, "identity-range"))
	if err != nil {
		t.Fatalf("the first runnerd saved no identity range: %v", err)
	}
	names := []string{fmt.Sprintf("runnerd pid %d", pa.cmd.Process.Pid), stateA}

	t.Run("default ranges are disjoint", func(t *testing.T) {
		stateB := passableTempDir(t)
		_, pb := startRunnerdProc(t, nil, stateB, "", "--claim-dir", claims)
		rangeB, err := os.ReadFile(filepath.Join(stateB, "identity-range"))
		if err != nil {
			t.Fatal(err)
		}
		fa, la, _ := daemon.ParseIdentityRange(strings.TrimSpace(string(rangeA)))
		fb, lb, _ := daemon.ParseIdentityRange(strings.TrimSpace(string(rangeB)))
		if fa <= lb && fb <= la {
			t.Errorf("default identity ranges overlap: %d-%d and %d-%d", fa, la, fb, lb)
		}
		pb.kill(syscall.SIGTERM)
	})
	t.Run("overlapping identity range refused", func(t *testing.T) {
		fa, _, _ := daemon.ParseIdentityRange(strings.TrimSpace(string(rangeA)))
		secondRunnerd(t, passableTempDir(t), append(names, "identity range"),
			"--claim-dir", claims, "--cgroup-root", testCgroupRoot(t), "--identity-range", fmt.Sprintf("%d-%d", fa+100, fa+200))
	})
	t.Run("same cgroup root refused", func(t *testing.T) {
		secondRunnerd(t, passableTempDir(t), append(names, "cgroup root"), "--claim-dir", claims, "--cgroup-root", root)
	})
	t.Run("a dead runnerd's claim is not held", func(t *testing.T) {
		stateC := passableTempDir(t)
		_, pc := startRunnerdProc(t, nil, stateC, "", "--claim-dir", claims, "--identity-range", "1880000000-1880000099")
		rangeC := "1880000000-1880000099"
		pc.kill(syscall.SIGKILL) // kill -9: the kernel drops its lock; its file stays
		_, pd := startRunnerdProc(t, nil, passableTempDir(t), "", "--claim-dir", claims, "--identity-range", rangeC)
		pd.kill(syscall.SIGTERM)
	})
}
