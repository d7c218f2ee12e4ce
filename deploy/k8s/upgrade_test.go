package k8s

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/internal/gobuild"
	"github.com/agentrunner/runner/internal/testpki"
	"github.com/agentrunner/runner/wire"
)

// hostStandIn plays the host for install-host.sh: a directory is its root
// and this process its systemd. The script's "host systemctl ..." runs a
// small script (RUNNER_HOST_EXEC) that hands restart, stop and disable
// requests to serve, which does what systemd does with the unit: a restart
// signals the main process only (KillMode=process) and starts ExecStart
// again with the unit's and the drop-in's environment.
type hostStandIn struct {
	t      *testing.T
	root   string
	ctl    string // the RUNNER_HOST_EXEC script
	listen string // loopback address runnerd serves on, instead of the drop-in's
	log    *os.File

	mu       sync.Mutex // guards cmd, requests
	cmd      *exec.Cmd
	requests []string
}

func newHostStandIn(t *testing.T) *hostStandIn {
	t.Helper()
	h := &hostStandIn{t: t, root: t.TempDir()}
	h.ctl = filepath.Join(t.TempDir(), "host-exec")
	script := fmt.Sprintf(`#!/bin/sh
# $1 is systemctl, $2 its verb.
case "$2" in
is-active) [ -f %[1]q/active ] ;;
restart|disable|stop|kill) echo "$*" > %[1]q/req.tmp; mv %[1]q/req.tmp %[1]q/req
  while [ -f %[1]q/req ]; do sleep 0.02; done ;;
*) exit 0 ;;
esac
`, h.root)
	if err := os.WriteFile(h.ctl, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h.listen = ln.Addr().String()
	ln.Close()
	if h.log, err = os.Create(filepath.Join(t.TempDir(), "runnerd.log")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { // the stand-in's systemd; ends at cleanup
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
			b, err := os.ReadFile(filepath.Join(h.root, "req"))
			if err != nil {
				continue
			}
			req := strings.TrimSpace(string(b))
			h.mu.Lock()
			h.requests = append(h.requests, req)
			h.mu.Unlock()
			h.stop()
			if strings.Contains(req, " restart ") {
				h.start()
			}
			os.Remove(filepath.Join(h.root, "req"))
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		h.stop()
		h.log.Close()
	})
	return h
}

// unitEnv is the environment systemd gives ExecStart: the unit's and the
// drop-in's Environment= lines and EnvironmentFile=, host paths under
// root, and StateDirectory's $STATE_DIRECTORY.
func (h *hostStandIn) unitEnv() []string {
	env := []string{"PATH=" + os.Getenv("PATH"), "STATE_DIRECTORY=" + filepath.Join(h.root, "var/lib/runnerd")}
	for _, f := range []string{"etc/systemd/system/runnerd.service", "etc/systemd/system/runnerd.service.d/fleet.conf"} {
		b, err := os.ReadFile(filepath.Join(h.root, f))
		if err != nil {
			h.t.Error(err)
			return nil
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			line := sc.Text()
			if v, ok := strings.CutPrefix(line, "Environment="); ok {
				k, val, _ := strings.Cut(v, "=")
				if strings.HasPrefix(val, "/") {
					val = filepath.Join(h.root, val)
				}
				env = append(env, k+"="+val)
			}
			if p, ok := strings.CutPrefix(line, "EnvironmentFile="); ok {
				// A leading "-" is systemd's "ignore a missing file".
				p, optional := strings.CutPrefix(p, "-")
				eb, err := os.ReadFile(filepath.Join(h.root, p))
				if err != nil && !(optional && errors.Is(err, os.ErrNotExist)) {
					h.t.Error(err)
					return nil
				}
				env = append(env, strings.Fields(string(eb))...)
			}
		}
	}
	// Loopback instead of every address; no containment or cgroups (the
	// subject is the upgrade, not isolation).
	return append(env, "RUNNERD_LISTEN="+h.listen, "RUNNERD_NETPOLICY=off", "RUNNERD_CGROUPS=off")
}

// execStart is the unit's ExecStart as systemd runs it with env: host
// paths under root, and a lone $VAR replaced by the words of its value
// (none when it is unset or empty), as systemd splits "$RUNNERD_ARGS".
func (h *hostStandIn) execStart(env []string) []string {
	b, err := os.ReadFile(filepath.Join(h.root, "etc/systemd/system/runnerd.service"))
	if err != nil {
		h.t.Error(err)
		return nil
	}
	lookup := func(k string) string {
		v := ""
		for _, kv := range env {
			if name, val, _ := strings.Cut(kv, "="); name == k {
				v = val
			}
		}
		return v
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "ExecStart="); ok {
			var argv []string
			for _, a := range strings.Fields(v) {
				switch {
				case strings.HasPrefix(a, "$"):
					argv = append(argv, strings.Fields(lookup(strings.TrimPrefix(a, "$")))...)
				case strings.HasPrefix(a, "/"):
					argv = append(argv, filepath.Join(h.root, a))
				default:
					argv = append(argv, a)
				}
			}
			return argv
		}
	}
	h.t.Error("no ExecStart in the unit")
	return nil
}

// start runs on the stand-in's systemd goroutine, so it reports with
// Errorf (a Fatal there would end that goroutine and hang the script
// waiting for its request).
func (h *hostStandIn) start() {
	env := h.unitEnv()
	if env == nil {
		return
	}
	argv := h.execStart(env)
	if argv == nil {
		return
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = h.log, h.log
	if err := cmd.Start(); err != nil {
		h.t.Errorf("start runnerd: %v", err)
		return
	}
	h.mu.Lock()
	h.cmd = cmd
	h.mu.Unlock()
	os.WriteFile(filepath.Join(h.root, "active"), nil, 0o600)
}

// stop is KillMode=process: SIGTERM to the main process alone, and wait.
func (h *hostStandIn) stop() {
	h.mu.Lock()
	cmd := h.cmd
	h.cmd = nil
	h.mu.Unlock()
	os.Remove(filepath.Join(h.root, "active"))
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Wait()
}

func (h *hostStandIn) requested() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.requests...)
}

// install runs install-host.sh (with args) as the DaemonSet's pod would,
// from the binaries in src, until it says it is done (it then stays, as
// the pod does, and is stopped with TERM) or exits. It returns the
// script's output and its exit code (-1 while it stayed).
func (h *hostStandIn) install(src, tlsDir, token string, args ...string) (string, int) {
	h.t.Helper()
	cmd := exec.Command("sh", append([]string{"install-host.sh"}, args...)...)
	cmd.Env = append(os.Environ(), "RUNNER_HOST_ROOT="+h.root, "RUNNER_SRC="+src, "RUNNER_FILES=.", "RUNNER_TLS="+tlsDir,
		"RUNNER_HOST_EXEC="+h.ctl, "RUNNERD_TOKEN="+token, "TMPDIR="+h.t.TempDir())
	pr, pw, err := os.Pipe()
	if err != nil {
		h.t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	// Its own process group, so what it leaves running is found.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		h.t.Fatal(err)
	}
	defer h.noneLeft(cmd.Process.Pid)
	pw.Close()
	var out bytes.Buffer
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		out.WriteString(sc.Text() + "\n")
		if strings.HasPrefix(sc.Text(), "runnerd installed") || strings.HasPrefix(sc.Text(), "runnerd removed") {
			cmd.Process.Signal(syscall.SIGTERM)
			go drain(pr)
			cmd.Wait()
			return out.String(), -1
		}
	}
	cmd.Wait()
	return out.String(), cmd.ProcessState.ExitCode()
}

// noneLeft fails the test if the script's process group (pgid) still has
// a live process a moment after the script ended (a pod's pid namespace
// would end it, a host would keep it), and kills what is left. A zombie
// is not alive: this machine's init may reap late.
func (h *hostStandIn) noneLeft(pgid int) {
	h.t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		left := liveInGroup(pgid)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			h.t.Errorf("install-host.sh left processes running in its group %d: %s", pgid, strings.Join(left, "; "))
			syscall.Kill(-pgid, syscall.SIGKILL)
			return
		}
	}
}

// liveInGroup lists the processes of group pgid that are not zombies, as
// "pid (comm) state".
func liveInGroup(pgid int) []string {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var left []string
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...; comm may hold spaces.
		end := bytes.LastIndexByte(b, ')')
		if end < 0 {
			continue
		}
		fields := strings.Fields(string(b[end+1:]))
		if len(fields) < 3 || fields[0] == "Z" || fields[2] != strconv.Itoa(pgid) {
			continue
		}
		left = append(left, string(b[:end+1])+" "+fields[0])
	}
	return left
}

// drain reads r to its end (the script's last words after TERM) and
// closes it.
func drain(r *os.File) {
	var b [512]byte
	for {
		if _, err := r.Read(b[:]); err != nil {
			r.Close()
			return
		}
	}
}

// buildRunner builds runnerd, runner-shim and runner at version into a
// directory, as the installer image carries them.
func buildRunner(t *testing.T, version string) string {
	t.Helper()
	dir := t.TempDir()
	if err := gobuild.Build(dir+"/", version,
		"github.com/agentrunner/runner/cmd/runnerd", "github.com/agentrunner/runner/cmd/runner-shim", "github.com/agentrunner/runner/cmd/runner"); err != nil {
		t.Fatalf("build %s: %v", version, err)
	}
	return dir
}

// TestInstallerUpgradeKeepsSessions replays what the installer does on a
// host: install v1, start a session over mTLS, "upgrade" by running the
// installer again with v2's binaries (it replaces them by rename and
// restarts the unit's main process), and the session, started under v1,
// finishes under v2 with its bytes and exit code intact. The placeholder
// token is refused before anything on the host changes, and the uninstall
// stops runnerd, removes the unit and binaries and keeps the state.
func TestInstallerUpgradeKeepsSessions(t *testing.T) {
	v1, v2 := buildRunner(t, "v1.0.0-test"), buildRunner(t, "v2.0.0-test")
	pki := t.TempDir()
	ca := testpki.NewCA(t, pki, "fleet")
	srv, cl := ca.Server(t, "runnerd"), ca.Client(t, "control-plane")
	tlsDir := t.TempDir()
	for src, dst := range map[string]string{srv.CertFile: "tls.crt", srv.KeyFile: "tls.key", ca.CertFile: "ca.crt"} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(tlsDir, dst), b, 0o600)
	}
	token := strings.Repeat("0123456789abcdef", 4)
	h := newHostStandIn(t)

	// The placeholder: refused, nothing written.
	out, code := h.install(v1, tlsDir, "change-me-before-applying")
	if code != 1 || !strings.Contains(out, "placeholder") {
		t.Fatalf("install with the placeholder token: exit %d, %q; want exit 1 naming the placeholder", code, out)
	}
	if _, err := os.Stat(filepath.Join(h.root, "usr/local/bin/runnerd")); err == nil || len(h.requested()) != 0 {
		t.Fatalf("the refused install touched the host (requests %v)", h.requested())
	}

	if out, code := h.install(v1, tlsDir, token); code != -1 {
		t.Fatalf("install v1: exit %d\n%s", code, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := client.New("https://"+h.listen, token, client.Options{RootCAs: ca.Pool(), Certificate: &cl.TLS})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitVersion := func(want string) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			hl, err := c.Health(ctx)
			if err == nil && hl.Version == want {
				return
			}
			if time.Now().After(deadline) {
				b, _ := os.ReadFile(h.log.Name())
				t.Fatalf("runnerd %s did not answer over mTLS: %v, %+v\n%s", want, err, hl, b)
			}
		}
	}
	waitVersion("v1.0.0-test")
	if _, err := c.CreateSandbox(ctx, wire.CreateSandbox{Name: "up"}); err != nil {
		t.Fatal(err)
	}
	ss, _, err := c.CreateSession(ctx, "up", wire.CreateSession{Argv: []string{"sh", "-c", `printf 'before\0'; read x; echo "after $x"; exit 3`}})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		s, err := c.Session(ctx, "up", ss.ID)
		if err == nil && s.Lengths["stdout"] == 7 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("session did not print its first line: %+v %v", s, err)
		}
	}

	// Same binaries again: nothing changed, no restart.
	if out, code := h.install(v1, tlsDir, token); code != -1 || len(h.requested()) != 1 {
		t.Fatalf("re-install of v1: exit %d, requests %v (want the first install's restart only)\n%s", code, h.requested(), out)
	}
	// The upgrade.
	if out, code := h.install(v2, tlsDir, token); code != -1 {
		t.Fatalf("install v2: exit %d\n%s", code, out)
	}
	if got := h.requested(); len(got) != 2 || !strings.Contains(got[1], "restart runnerd.service") {
		t.Fatalf("requests %v: want a second restart for the upgrade", got)
	}
	waitVersion("v2.0.0-test")
	if err := c.WriteStdin(ctx, "up", ss.ID, []byte("x\n")); err != nil {
		t.Fatalf("stdin after the upgrade: %v", err)
	}
	fr, err := c.Attach(ctx, "up", ss.ID, client.Cursors{})
	if err != nil {
		t.Fatal(err)
	}
	defer fr.Close()
	var got []byte
	for {
		f, err := fr.Next()
		if err != nil {
			t.Fatalf("attach after the upgrade: %v", err)
		}
		if f.Kind == wire.FrameData {
			got = append(got, f.Payload...)
			continue
		}
		e, err := f.Exit()
		if err != nil || e.Reason != "exited" || e.Code != 3 || string(got) != "before\x00after x\n" {
			t.Fatalf("session across the upgrade: got %q, exit %+v (%v); want \"before\\x00after x\\n\" and exit 3", got, e, err)
		}
		break
	}

	// Uninstall, keeping the state.
	if out, code := h.install(v2, tlsDir, token, "uninstall"); code != -1 || !strings.Contains(out, "state kept") {
		t.Fatalf("uninstall: exit %d\n%s", code, out)
	}
	for _, p := range []string{"usr/local/bin/runnerd", "usr/local/bin/runner-shim", "etc/systemd/system/runnerd.service", "etc/runnerd"} {
		if _, err := os.Stat(filepath.Join(h.root, p)); err == nil {
			t.Errorf("uninstall left %s", p)
		}
	}
	if _, err := os.Stat(filepath.Join(h.root, "var/lib/runnerd/registry.db")); err != nil {
		t.Errorf("uninstall without RUNNER_REMOVE_STATE removed the state: %v", err)
	}
	if _, err := c.Health(ctx); err == nil {
		t.Error("runnerd still answers after the uninstall")
	}
}
