package shim

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/shim/internal/shimtest"
	"github.com/agentrunner/runner/shim/launch"
	"github.com/agentrunner/runner/shim/sessiondir"
)

// BenchmarkSpawnAck measures Start of `/bin/true` until the shim's ack
// (the command has exec'd), with the same run's plain fork/exec of
// /bin/true as the baseline; the shim is the real runner-shim binary:
//
//	go test -run XXX -bench 'SpawnAck|ForkExec' -benchmem ./shim/
func BenchmarkSpawnAck(b *testing.B) {
	exe := []string{buildShim(b), "serve"}
	root, err := os.MkdirTemp("", "shb")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(root)
	ctx := context.Background()
	i := 0
	for b.Loop() {
		i++
		dir := filepath.Join(root, strconv.Itoa(i))
		st, err := shimtest.ColdStart(ctx, exe, dir, sessiondir.Spec{ID: "b", Argv: []string{"/bin/true"}, Env: shimtest.TestEnv})
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		waitShimExit(b, dir, st.ShimPID)
		b.StartTimer()
	}
}

// BenchmarkPoolSpawnAck is BenchmarkSpawnAck through a warm shim: the
// timer stops while the pool refills, so it measures the ack of a start
// that found a warm shim idle (the refill's process starts are off the
// ack path, not free: they cost CPU between spawns).
func BenchmarkPoolSpawnAck(b *testing.B) {
	exe := []string{buildShim(b), "serve"}
	root, err := os.MkdirTemp("", "shb")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(root)
	p := launch.NewPool(exe, launch.PoolOptions{Size: 1, Root: root})
	defer p.Close()
	ctx := context.Background()
	i := 0
	for b.Loop() {
		b.StopTimer()
		for len(p.WarmPIDs()) == 0 {
			time.Sleep(time.Millisecond)
		}
		b.StartTimer()
		i++
		dir := filepath.Join(root, strconv.Itoa(i))
		st, err := p.Start(ctx, dir, sessiondir.Spec{ID: "b", Argv: []string{"/bin/true"}, Env: shimtest.TestEnv})
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		waitShimExit(b, dir, st.ShimPID)
		b.StartTimer()
	}
}

// BenchmarkForkExecTrue is the baseline: fork/exec of /bin/true until
// exec.Cmd.Start returns (execve done), plus its wait.
func BenchmarkForkExecTrue(b *testing.B) {
	for b.Loop() {
		cmd := exec.Command("/bin/true")
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		cmd.Wait()
		b.StartTimer()
	}
}

func waitShimExit(b *testing.B, dir string, pid int) {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if st, err := sessiondir.ReadStatus(dir); err == nil && st.State != sessiondir.StateRunning {
			if _, err := os.Stat(filepath.Join(dir, sessiondir.SocketFile)); os.IsNotExist(err) {
				return
			}
		}
		time.Sleep(time.Millisecond)
	}
	b.Fatalf("shim %d did not finish", pid)
}

// BenchmarkIdleShimMemory builds the real runner-shim binary, runs an idle
// `sleep` under it and reports the idle shim's memory from
// /proc/PID/smaps_rollup in KiB: Private_Dirty and Pss_Anon (memory only
// this shim uses), Pss_File (its share of the binary's mapped text, shared
// by every shim of the same binary), Pss and Rss.
//
//	go test -run XXX -bench IdleShimMemory -benchtime 1x ./shim/
func BenchmarkIdleShimMemory(b *testing.B) {
	bin := buildShim(b)
	root, err := os.MkdirTemp("", "shm")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(root)
	var m map[string]int
	for i := 0; b.Loop(); i++ {
		dir := filepath.Join(root, strconv.Itoa(i))
		st, err := shimtest.ColdStart(context.Background(), []string{bin, "serve"}, dir, sessiondir.Spec{ID: "m", Argv: []string{"sleep", "30"}, Env: shimtest.TestEnv})
		if err != nil {
			b.Fatal(err)
		}
		// Some output and a control round trip first, then idle.
		c, err := launch.Dial(context.Background(), dir)
		if err != nil {
			b.Fatal(err)
		}
		c.Status(context.Background())
		time.Sleep(1500 * time.Millisecond)
		m, err = smapsRollup(st.ShimPID)
		if err != nil {
			b.Fatal(err)
		}
		c.Terminate(context.Background(), 0)
		c.Close()
		waitShimExit(b, dir, st.ShimPID)
	}
	for _, k := range []string{"Private_Dirty", "Pss_Anon", "Pss_File", "Pss", "Rss"} {
		b.ReportMetric(float64(m[k]), k+"-KiB")
	}
}

// buildShim builds cmd/runner-shim into a temporary directory.
func buildShim(b *testing.B) string {
	bin := filepath.Join(b.TempDir(), "runner-shim")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/runner-shim").CombinedOutput(); err != nil {
		b.Skipf("build runner-shim: %v\n%s", err, out)
	}
	// The fresh binary's page-cache pages are dirty until written back, and
	// smaps counts dirty file pages as Private_Dirty: write them back first.
	syscall.Sync()
	return bin
}

func smapsRollup(pid int) (map[string]int, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	m := map[string]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fs := strings.Fields(v)
		if len(fs) == 2 && fs[1] == "kB" {
			m[k], _ = strconv.Atoi(fs[0])
		}
	}
	return m, sc.Err()
}
