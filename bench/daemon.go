package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/wire"
)

const module = "github.com/agentrunner/runner"

// binaries are the executables a run builds.
type binaries struct {
	runnerd  string // cmd/runnerd
	shim     string // cmd/runner-shim: the sessions' supervisor, as the installed unit runs it
	writer   string // bench/internal/writer: the follow-latency command
	profshim string // bench/internal/profshim (profile runs only)
}

// build compiles runnerd and the helpers into dir with the go command
// (the same toolchain as the harness).
func build(ctx context.Context, dir string, profiling bool) (binaries, error) {
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return binaries{}, err
	}
	pkgs := []string{module + "/cmd/runnerd", module + "/cmd/runner-shim", module + "/bench/internal/writer"}
	if profiling {
		pkgs = append(pkgs, module+"/bench/internal/profshim")
	}
	cmd := exec.CommandContext(ctx, goTool(), append([]string{"build", "-o", bin + "/"}, pkgs...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return binaries{}, fmt.Errorf("build runnerd: %v\n%s", err, out)
	}
	b := binaries{runnerd: filepath.Join(bin, "runnerd"), shim: filepath.Join(bin, "runner-shim"), writer: filepath.Join(bin, "writer")}
	if profiling {
		b.profshim = filepath.Join(bin, "profshim")
	}
	return b, nil
}

// goTool finds the go command: $GOROOT/bin/go of the running toolchain
// when present, else "go" on PATH.
func goTool() string {
	if root := os.Getenv("GOROOT"); root != "" {
		if p := filepath.Join(root, "bin", "go"); fileExists(p) {
			return p
		}
	}
	return "go"
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// daemonProc is a runnerd the harness started, and a client of it.
type daemonProc struct {
	state string
	pid   int
	url   string // http://127.0.0.1:port
	token string
	c     *client.Client
	stop  func()
}

// startDaemon starts the built runnerd on a fresh state directory, TCP on
// a free loopback port, no unix socket, and waits for /healthz. cgroups,
// when not empty, is runnerd's --cgroups; isolate its --isolate ("" is
// "none").
func startDaemon(ctx context.Context, dir string, bins binaries, cgroups, isolate string) (*daemonProc, error) {
	state := filepath.Join(dir, "state")
	if err := os.MkdirAll(state, 0o700); err != nil {
		return nil, err
	}
	addr, err := freePort()
	if err != nil {
		return nil, err
	}
	token := randomToken()
	logf, err := os.Create(filepath.Join(dir, "runnerd.log"))
	if err != nil {
		return nil, err
	}
	// As installed (systemd/runnerd.service): sessions under runner-shim.
	// Network containment off: as root it would set up nftables in the
	// real host's namespace, and no figure here needs it. Isolation off
	// (-isolate none; the default as root is all since issue #24): the
	// figures here and in docs/benchmarks.md are of uncontained sandboxes,
	// and the commands run the harness's binaries from its 0700 temporary
	// directory. Isolated against uncontained is the speed issue's figure.
	// Without runnerd's per-sandbox defaults (pids, memory, sessions,
	// journal bytes; docs/cgroups.md): the scale and idle figures hold a
	// thousand sessions in one sandbox and the stream figures write
	// gigabytes, and every figure stays comparable with the ones taken
	// before the defaults existed.
	cmd := exec.Command(bins.runnerd, "-state", state, "-listen", addr, "-socket", "none", "-log-level", "warn",
		"-shim", bins.shim, "-netpolicy", "off",
		"-sandbox-max-sessions", "0", "-sandbox-max-ended-sessions", "0", "-sandbox-journal-bytes", "0", "-default-pids", "0", "-default-memory", "0")
	if isolate == "" {
		isolate = "none"
	}
	cmd.Args = append(cmd.Args, "-isolate", isolate)
	if cgroups != "" {
		cmd.Args = append(cmd.Args, "-cgroups", cgroups)
	}
	// A cgroup root of this run's own: the default ("runner") is shared by
	// every runnerd in the same v1 pids/cpu/freezer cgroup, and the
	// harness's sandbox and session names (stream-1, live-4) are the same
	// in every run, so two runs on one host shared session cgroups and
	// one's removal SIGKILLed the other's command mid-stream.
	root := "runnerbench-" + randomToken()[:12]
	cmd.Args = append(cmd.Args, "-cgroup-root", root)
	cmd.Env = append(os.Environ(), "RUNNERD_TOKEN="+token)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start runnerd: %w", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(exited) }()
	stop := func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		removeCgroupRoot(root)
	}
	c, err := client.New("http://"+addr, token, client.Options{})
	if err != nil {
		stop()
		return nil, err
	}
	d := &daemonProc{state: state, pid: cmd.Process.Pid, url: "http://" + addr, token: token, c: c, stop: func() { c.Close(); stop() }}
	if err := waitHealthy(ctx, c, exited); err != nil {
		d.stop()
		b, _ := os.ReadFile(filepath.Join(dir, "runnerd.log"))
		return nil, fmt.Errorf("%w; runnerd log:\n%s", err, b)
	}
	return d, nil
}

// removeCgroupRoot removes the (by now empty) directories of a run's
// cgroup root, nested under this process's cgroup in each hierarchy as
// runnerd, its child, placed them. runnerd never removes its root itself.
// Best effort: a directory still holding a cgroup stays.
func removeCgroupRoot(root string) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		rel := filepath.Join(parts[2], root)
		dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", rel))
		for _, d := range append(dirs, filepath.Join("/sys/fs/cgroup", rel)) {
			os.Remove(d)
		}
	}
}

func waitHealthy(ctx context.Context, c *client.Client, exited <-chan struct{}) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		hctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := c.Health(hctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return errors.New("runnerd exited before it served")
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("runnerd did not answer /healthz: %w", err)
		}
	}
}

func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func randomToken() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// newSandbox creates a sandbox with a fresh name.
func (h *harness) newSandbox(ctx context.Context, prefix string) (string, error) {
	name := h.name(prefix)
	if _, err := h.d.c.CreateSandbox(ctx, wire.CreateSandbox{Name: name}); err != nil {
		return "", fmt.Errorf("create sandbox %s: %w", name, err)
	}
	return name, nil
}

// dropSandbox destroys a sandbox (its sessions, journals and workspace).
func (h *harness) dropSandbox(ctx context.Context, name string) {
	if err := h.d.c.DeleteSandbox(ctx, name); err != nil {
		h.logf("delete sandbox %s: %v", name, err)
	}
}
