package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/internal/logsink"
	"github.com/agentrunner/runner/wire"
)

// The tests drive the real binaries: runnerd started on a temp state
// directory, and runner as a subprocess that finds it on its own
// (RUNNERD_STATE), exactly as a person's shell would.

var binDir string // runner and runnerd, built once in TestMain

func TestMain(m *testing.M) {
	// The binaries here are built with the race detector, which sleeps
	// a second at every process exit (GORACE atexit_sleep_ms, default
	// 1000) to let late race reports print: each runnerd stop, runner
	// call and shim exit paid it. Their reports still print; a race
	// found in the last instant of an exit may not.
	if os.Getenv("GORACE") == "" {
		os.Setenv("GORACE", "atexit_sleep_ms=0")
	}
	dir, err := os.MkdirTemp("", "runner-cli-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	build := func(pkg string, race bool) error {
		args := []string{"build", "-o", dir + "/"}
		if race {
			args = append(args, "-race")
		}
		cmd := exec.Command("go", append(args, pkg)...)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		return cmd.Run()
	}
	if err := build("github.com/agentrunner/runner/cmd/runnerd", false); err != nil {
		fmt.Fprintln(os.Stderr, "build runnerd:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	// The CLI under test is built with -race when the tests are.
	if err := build("github.com/agentrunner/runner/cmd/runner", raceEnabled); err != nil {
		fmt.Fprintln(os.Stderr, "build runner:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	stopShared()
	os.RemoveAll(dir)
	os.Exit(code)
}

// daemon is one runnerd process on its own state directory.
type daemon struct {
	state string
	addr  string // TCP host:port
	cmd   *exec.Cmd
	log   *syncBuffer
	done  chan struct{}
}

type syncBuffer = logsink.Buffer

var tcpRe = regexp.MustCompile(`tcp=(127\.0\.0\.1:\d+)`)

// startDaemon starts runnerd on state (created if needed) and waits until it
// serves. The caller stops it with stop.
func startDaemon(state string) (*daemon, error) {
	return startDaemonBin(filepath.Join(binDir, "runnerd"), state)
}

// startDaemonBin is startDaemon with the runnerd binary at bin.
func startDaemonBin(bin, state string) (*daemon, error) {
	return startDaemonArgs(bin, state,
		"--netpolicy", "off", // as root, auto would set up nftables in the real host's namespace
		"--cgroups", "off") // and sandbox cgroups in the test process's own cgroup
}

// startDaemonArgs is startDaemonBin with runnerd's flags beyond --state
// and --listen.
func startDaemonArgs(bin, state string, args ...string) (*daemon, error) {
	if err := os.MkdirAll(state, 0o700); err != nil {
		return nil, err
	}
	d := &daemon{state: state, log: &syncBuffer{}, done: make(chan struct{})}
	d.cmd = exec.Command(bin, append([]string{"--state", state, "--listen", "127.0.0.1:0"}, args...)...)
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	d.cmd.Env = append(os.Environ(), "RUNNERD_TOKEN=")
	if err := d.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { _ = d.cmd.Wait(); close(d.done) }()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if m := tcpRe.FindStringSubmatch(d.log.String()); m != nil {
			if _, err := os.Stat(filepath.Join(state, "runnerd.sock")); err == nil {
				d.addr = m[1]
				return d, nil
			}
		}
		select {
		case <-d.done:
			return nil, fmt.Errorf("runnerd exited early: %s", d.log.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	d.stop()
	return nil, fmt.Errorf("runnerd did not start in 20s: %s", d.log.String())
}

// stop removes every sandbox (sessions outlive runnerd by design, so they
// are stopped through it first), then stops runnerd gracefully.
func (d *daemon) stop() {
	select {
	case <-d.done:
		return
	default:
	}
	if out, _, code := runCLIEnv(d.env(), nil, "ls", "--json"); code == 0 {
		var sbs []wire.Sandbox
		if json.Unmarshal(out, &sbs) == nil {
			for _, sb := range sbs {
				runCLIEnv(d.env(), nil, "rm", sb.Name)
			}
		}
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(15 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.done
	}
}

// env is a clean environment in which runner finds this daemon on its own.
func (d *daemon) env() []string {
	return cliEnv("RUNNERD_STATE=" + d.state)
}

func cliEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(k, "RUNNERD_"), k == "STATE_DIRECTORY", k == "XDG_STATE_HOME", k == "HOME", k == "TMUX", k == "GORACE":
			continue
		}
		env = append(env, kv)
	}
	home := filepath.Join(binDir, "home") // no ~/.local/state/runnerd there
	// A -race binary sleeps 1 s at exit by default; a race still fails
	// the run (exit 66).
	return append(append(env, "HOME="+home, "GORACE=atexit_sleep_ms=0"), extra...)
}

var (
	sharedOnce sync.Once
	shared     *daemon
	sharedErr  error
	sharedDir  string
)

// sharedDaemon is one runnerd for the tests that only need a working
// daemon; each test uses its own sandbox names.
func sharedDaemon(t *testing.T) *daemon {
	t.Helper()
	sharedOnce.Do(func() {
		sharedDir, sharedErr = os.MkdirTemp("", "runner-cli-state-")
		if sharedErr == nil {
			shared, sharedErr = startDaemon(sharedDir)
		}
	})
	if sharedErr != nil {
		t.Fatalf("start runnerd: %v", sharedErr)
	}
	return shared
}

func stopShared() {
	if shared != nil {
		shared.stop()
	}
	if sharedDir != "" {
		os.RemoveAll(sharedDir)
	}
}

// runCLIEnv runs runner with env and stdin and returns stdout, stderr and
// the exit code.
func runCLIEnv(env []string, stdin []byte, args ...string) (stdout, stderr []byte, code int) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "runner"), args...)
	cmd.Env = env
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	code = cmd.ProcessState.ExitCode()
	if err != nil && code < 0 {
		return o.Bytes(), append(e.Bytes(), []byte(err.Error())...), -1
	}
	return o.Bytes(), e.Bytes(), code
}

// cli runs runner against d and returns stdout, stderr and the exit code.
func (d *daemon) cli(t *testing.T, stdin []byte, args ...string) (string, string, int) {
	t.Helper()
	o, e, code := runCLIEnv(d.env(), stdin, args...)
	return string(o), string(e), code
}

// ok runs runner and fails the test unless it exits 0.
func (d *daemon) ok(t *testing.T, args ...string) string {
	t.Helper()
	o, e, code := d.cli(t, nil, args...)
	if code != 0 {
		t.Fatalf("runner %s: exit %d, want 0; stderr: %s", strings.Join(args, " "), code, e)
	}
	return o
}

// sandbox creates a sandbox for one test and removes it at the end.
func (d *daemon) sandbox(t *testing.T, name string) string {
	t.Helper()
	d.ok(t, "create", name)
	t.Cleanup(func() { runCLIEnv(d.env(), nil, "rm", name) })
	return name
}

func decode[T any](t *testing.T, s string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("decode %q: %v", s, err)
	}
	return v
}
