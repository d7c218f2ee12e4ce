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

// TestTwoRunnerdsClaims: two real runnerds on one host (--isolate all:
// uid identity ranges; pods' subordinate ranges are claimed the same way,
// the last subtest). With their default identity ranges they get disjoint ones (each chosen for its
// state directory and saved there, the same after a restart); a second
// runnerd whose --identity-range overlaps the first's, or whose cgroup
// root is the first's, refuses to start, naming the first (its pid and
// state directory). Before, both ran, handing out the same uids and
// adopting each other's cgroups.
func TestTwoRunnerdsClaims(t *testing.T) {
	claims := t.TempDir()
	root := "claim-test-" + fmt.Sprint(os.Getpid())
	stateA := passableTempDir(t)
	_, pa := startRunnerdProc(t, nil, stateA, "", "--claim-dir", claims, "--isolate", "all", "--cgroup-root", root)
	rangeA, err := os.ReadFile(filepath.Join(stateA, "identity-range"))
	if err != nil {
		t.Fatalf("the first runnerd saved no identity range: %v", err)
	}
	names := []string{fmt.Sprintf("runnerd pid %d", pa.cmd.Process.Pid), stateA}

	t.Run("default ranges are disjoint", func(t *testing.T) {
		stateB := passableTempDir(t)
		_, pb := startRunnerdProc(t, nil, stateB, "", "--claim-dir", claims, "--isolate", "all")
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
			"--claim-dir", claims, "--isolate", "all", "--cgroup-root", testCgroupRoot(t), "--identity-range", fmt.Sprintf("%d-%d", fa+100, fa+200))
	})
	t.Run("same cgroup root refused", func(t *testing.T) {
		secondRunnerd(t, passableTempDir(t), append(names, "cgroup root"), "--claim-dir", claims, "--isolate", "all", "--cgroup-root", root)
	})
	t.Run("pods' default subordinate ranges are disjoint", func(t *testing.T) {
		// The default as root where pods can be made: each runnerd's pods
		// take blocks from a slot of its own, saved as subid-range, and
		// disjoint from the first runnerd's uid range too.
		var ranges []string
		for range 2 {
			state := passableTempDir(t)
			_, p := startRunnerdProc(t, nil, state, "", "--claim-dir", claims, "--isolate", "pod")
			raw, err := os.ReadFile(filepath.Join(state, "subid-range"))
			if err != nil {
				t.Fatalf("a pod runnerd saved no subordinate range: %v", err)
			}
			if _, err := os.Stat(filepath.Join(state, "identity-range")); !os.IsNotExist(err) {
				t.Errorf("a pod runnerd's fresh state directory has an identity-range file: %v", err)
			}
			ranges = append(ranges, strings.TrimSpace(string(raw)))
			if f, l, err := daemon.ParseIdentityRange(ranges[len(ranges)-1]); err != nil || l-f+1 != 256<<16 {
				t.Errorf("subordinate range %s (%v), want a slot of 256 blocks of 65,536 ids", ranges[len(ranges)-1], err)
			}
			defer p.kill(syscall.SIGTERM)
		}
		ranges = append(ranges, strings.TrimSpace(string(rangeA)))
		for i := range ranges {
			for j := i + 1; j < len(ranges); j++ {
				fi, li, err1 := daemon.ParseIdentityRange(ranges[i])
				fj, lj, err2 := daemon.ParseIdentityRange(ranges[j])
				if err1 != nil || err2 != nil {
					t.Fatalf("ranges %q: %v %v", ranges, err1, err2)
				}
				if fi <= lj && fj <= li {
					t.Errorf("ranges overlap: %s and %s", ranges[i], ranges[j])
				}
			}
		}
	})
	t.Run("a dead runnerd's claim is not held", func(t *testing.T) {
		stateC := passableTempDir(t)
		_, pc := startRunnerdProc(t, nil, stateC, "", "--claim-dir", claims, "--isolate", "all", "--identity-range", "1880000000-1880000099")
		rangeC := "1880000000-1880000099"
		pc.kill(syscall.SIGKILL) // kill -9: the kernel drops its lock; its file stays
		_, pd := startRunnerdProc(t, nil, passableTempDir(t), "", "--claim-dir", claims, "--isolate", "all", "--identity-range", rangeC)
		pd.kill(syscall.SIGTERM)
	})
}
