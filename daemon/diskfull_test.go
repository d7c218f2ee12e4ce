package daemon_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentrunner/runner/daemon"
	"github.com/agentrunner/runner/internal/testcap"
	"github.com/agentrunner/runner/wire"
)

// stateTmpfs mounts a tmpfs with the given options (size=, nr_inodes=) as
// a fresh state directory, unmounted (detached if busy) after the daemon.
func stateTmpfs(t *testing.T, opts string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		testcap.Skip(t, "root", "mounts a sized tmpfs as the state directory to fill it")
	}
	dir := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, opts+",mode=0711"); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			unix.Unmount(dir, unix.MNT_DETACH)
		}
	})
	return dir
}

// freeOf is the free bytes and inodes of the file system at dir.
func freeOf(t *testing.T, dir string) (bytes, inodes uint64) {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return st.Bfree * uint64(st.Bsize), st.Ffree
}

// quick is a's client with a short timeout: an answer that takes longer
// is a hang.
func quick(a *api, d time.Duration) *api {
	b := *a
	b.hc = &http.Client{Timeout: d}
	return &b
}

// answeredPromptly fails t unless r is a success with status ok or 507
// write_failed asking for a retry: the two honest answers on a full disk.
func answeredPromptly(t *testing.T, what string, r response, took time.Duration, ok int) {
	t.Helper()
	switch {
	case r.status == 0:
		t.Errorf("%s: no answer within %v: %s", what, took, r.body)
	case r.status == ok:
	case r.status == 507 && r.code() == wire.CodeWriteFailed && r.errBody(t).RetryAfterMS > 0:
	default:
		t.Errorf("%s: got %d %s, want %d or 507 write_failed with retry_after_ms", what, r.status, r.body, ok)
	}
}

// fullDiskDaemon starts runnerd on a tmpfs state directory mounted with
// opts, with sandboxes filler, "other" and "busy" (running sleep 600 as
// session b).
func fullDiskDaemon(t *testing.T, opts, filler string) (*api, string) {
	t.Helper()
	state := stateTmpfs(t, opts)
	a := startDaemonCfg(t, daemon.Config{StateDir: state, Token: testToken, NetPolicy: daemon.NetPolicyOff})
	for _, name := range []string{filler, "other", "busy"} {
		a.createSandbox(name)
	}
	a.spawn("busy", wire.CreateSession{ID: "b", Argv: []string{"sleep", "600"}})
	return a, state
}

// TestDiskFullFlood: a command writes more to stdout than the state file
// system holds. Another sandbox's exec answers promptly (success or 507
// with retry_after_ms); suspending a third sandbox stops its session and
// records it; signal, terminate, delete session and destroy of the
// flooder work, every stored byte stays readable to the end, the exit
// names what was not stored, and the destroy frees the space and sets
// the registry's reserve aside again.
func TestDiskFullFlood(t *testing.T) {
	a, state := fullDiskDaemon(t, "size=48m", "flood")
	a.spawn("flood", wire.CreateSession{ID: "f", Argv: []string{"head", "-c", "100000000", "/dev/zero"}})
	deadline := time.Now().Add(60 * time.Second)
	for {
		if b, _ := freeOf(t, state); b < 64<<10 {
			break
		}
		if time.Now().After(deadline) {
			b, _ := freeOf(t, state)
			t.Fatalf("the flood did not fill the disk: %d bytes free", b)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var s wire.Session
	a.must("GET", "/v1/sandboxes/flood/sessions/f", nil, 200, &s)
	if s.State != wire.SessionRunning {
		t.Fatalf("flooder: state %q, want running (waiting for space)", s.State)
	}

	q := quick(a, 15*time.Second)
	timed := func(method, path, body string) (response, time.Duration) {
		t0 := time.Now()
		r := doTimed(q, method, path, body)
		return r, time.Since(t0)
	}
	for i := range 3 { // more than the warm shims: cold starts too
		// Output that needs a block the disk does not have: the exec
		// must answer, not wait for space.
		r, took := timed("POST", "/v1/sandboxes/other/exec", `{"argv":["sh","-c","head -c 300000 /dev/zero; echo done"]}`)
		answeredPromptly(t, fmt.Sprint("other's exec ", i), r, took, 200)
	}
	r, took := timed("POST", "/v1/sandboxes/busy/suspend", "")
	if r.status != 200 {
		t.Fatalf("suspend another sandbox on a full disk: got %d %s after %v, want 200", r.status, r.body, took)
	}
	a.must("GET", "/v1/sandboxes/busy/sessions/b", nil, 200, &s)
	if s.State != wire.SessionExited || s.Exit == nil || !s.Exit.Terminated {
		t.Errorf("busy's session after the suspend: got %q %+v, want exited, terminated", s.State, s.Exit)
	}
	if r, _ := timed("POST", "/v1/sandboxes/flood/sessions/f/signal", `{"signal":"SIGCONT"}`); r.status != 204 {
		t.Errorf("signal the flooder: got %d %s, want 204", r.status, r.body)
	}
	r, took = timed("POST", "/v1/sandboxes/flood/sessions/f/terminate", `{"grace_ms":200}`)
	if r.status != 200 {
		t.Fatalf("terminate the flooder: got %d %s after %v, want 200", r.status, r.body, took)
	}
	var exit wire.Exit
	if err := jsonUnmarshal(r.body, &exit); err != nil {
		t.Fatal(err)
	}
	n := exit.Lengths["stdout"]
	if !exit.Terminated || n < 20<<20 || n >= 100000000 {
		t.Fatalf("flooder's exit: got %+v, want terminated with over 20 MiB stored", exit)
	}
	if exit.UnstoredBytes > 0 && exit.Cause != wire.ExitCauseDiskFull {
		t.Errorf("exit cause %q with %d unstored bytes on a full disk, want %s", exit.Cause, exit.UnstoredBytes, wire.ExitCauseDiskFull)
	}
	if exit.UnstoredBytes > 0 && !strings.Contains(exit.Detail, fmt.Sprintf("%d bytes of output were not stored", exit.UnstoredBytes)) {
		t.Errorf("exit detail %q does not name the %d unstored bytes", exit.Detail, exit.UnstoredBytes)
	}
	// The last stored bytes are readable, and the stream ends at the
	// exit's length.
	res := a.attach(ctxFor(t, 30*time.Second), "flood", "f", fmt.Sprintf("stdout=%d&stderr=0", n-4096), nil)
	if got := res.streams["stdout"]; len(got) != 4096 || strings.Trim(string(got), "\x00") != "" || res.terminal == nil || res.terminal.Kind != wire.FrameExit {
		t.Errorf("read the flooder's last 4096 bytes: got %d bytes, terminal %v, want 4096 zero bytes and the exit", len(got), res.terminal)
	}
	if r, took := timed("DELETE", "/v1/sandboxes/flood/sessions/f", ""); r.status != 204 {
		t.Fatalf("delete the flooder's session: got %d %s after %v, want 204", r.status, r.body, took)
	}
	if r, took := timed("DELETE", "/v1/sandboxes/flood", ""); r.status != 204 {
		t.Fatalf("destroy the flooder: got %d %s after %v, want 204", r.status, r.body, took)
	}
	if b, _ := freeOf(t, state); b < 30<<20 {
		t.Errorf("after the destroy: %d bytes free, want the flood's space back", b)
	}
	if fi, err := os.Stat(filepath.Join(state, "registry.reserve")); err != nil || fi.Size() != daemon.DefaultDiskReserve {
		t.Errorf("registry reserve after the destroy: %v %v, want %d bytes set aside again", fi, err, daemon.DefaultDiskReserve)
	}
	if res := a.exec("other", wire.Exec{Argv: []string{"echo", "ok"}}); string(res.Stdout) != "ok\n" {
		t.Errorf("exec after the destroy: got %q, want ok", res.Stdout)
	}
}

// TestDiskFullInodes: a command takes every inode of the state file
// system (empty files in its workspace). Its own exec (no timeout_ms)
// answers; other sandboxes' execs answer promptly, success or 507 with
// retry_after_ms; a suspend of another sandbox and the filler's destroy
// work, and the destroy gives the inodes back.
func TestDiskFullInodes(t *testing.T) {
	a, state := fullDiskDaemon(t, "size=256m,nr_inodes=2500", "filler")
	q := quick(a, 20*time.Second)
	t0 := time.Now()
	r := doTimed(q, "POST", "/v1/sandboxes/filler/exec", `{"argv":["sh","-c","seq -f f%g 5000 | xargs touch 2>/dev/null; echo done"]}`)
	if r.status != 200 || !strings.Contains(string(r.body), `"stdout":"ZG9uZQo="`) {
		t.Fatalf("the filler's exec: got %d %s after %v, want 200 with stdout done", r.status, r.body, time.Since(t0))
	}
	if _, inodes := freeOf(t, state); inodes > 2 {
		t.Fatalf("the filler left %d inodes free, want none", inodes)
	}
	for i := range 3 {
		t0 := time.Now()
		r := doTimed(q, "POST", "/v1/sandboxes/other/exec", `{"argv":["true"]}`)
		answeredPromptly(t, fmt.Sprint("other's exec ", i), r, time.Since(t0), 200)
	}
	if r := doTimed(q, "POST", "/v1/sandboxes/busy/suspend", ""); r.status != 200 {
		t.Fatalf("suspend another sandbox with no inodes: got %d %s, want 200", r.status, r.body)
	}
	if r := doTimed(q, "DELETE", "/v1/sandboxes/filler", ""); r.status != 204 {
		t.Fatalf("destroy the filler: got %d %s, want 204", r.status, r.body)
	}
	if _, inodes := freeOf(t, state); inodes < 2000 {
		t.Errorf("after the destroy: %d inodes free, want the filler's back", inodes)
	}
	if res := a.exec("other", wire.Exec{Argv: []string{"echo", "ok"}}); string(res.Stdout) != "ok\n" {
		t.Errorf("exec after the destroy: got %q, want ok", res.Stdout)
	}
}

// doTimed is a.do that returns status 0 on a client timeout instead of failing.
func doTimed(a *api, method, path, body string) response {
	req, _ := http.NewRequest(method, a.base+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+a.token)
	resp, err := a.hc.Do(req)
	if err != nil {
		return response{body: []byte(err.Error())}
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: raw}
}

// TestDiskBudgetRefused: a disk budget, which this runnerd does not
// enforce, is refused 501 not_supported at create (leaving no sandbox and
// no workspace) and by PUT .../limits (leaving the limits as they were),
// with resource limits on, so that the refusal is the disk budget's own.
func TestDiskBudgetRefused(t *testing.T) {
	a := startDaemon(t)
	var caps wire.Capabilities
	a.must("GET", "/v1/capabilities", nil, 200, &caps)
	hasLimits := false
	for _, c := range caps.Capabilities {
		hasLimits = hasLimits || c == wire.CapResourceLimits
	}
	for _, body := range []string{
		`{"name":"box","limits":{"disk_bytes":1048576}}`,
		`{"name":"box","limits":{"memory_bytes":67108864,"disk_inodes":100}}`,
	} {
		a.wantError(a.do("POST", "/v1/sandboxes", body), 501, wire.CodeNotSupported)
		a.wantError(a.do("GET", "/v1/sandboxes/box", nil), 404, wire.CodeNotFound)
		if _, err := os.Stat(filepath.Join(a.state, "sandboxes", "box")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("after a refused create: workspace stat err %v, want none", err)
		}
	}
	if !hasLimits {
		testcap.Skip(t, "cgroups", "PUT .../limits needs resource_limits")
	}
	var sb wire.Sandbox
	a.must("POST", "/v1/sandboxes", `{"name":"box","limits":{"memory_bytes":67108864}}`, 200, &sb)
	a.wantError(a.do("PUT", "/v1/sandboxes/box/limits", `{"memory_bytes":67108864,"disk_bytes":1048576}`), 501, wire.CodeNotSupported)
	a.must("GET", "/v1/sandboxes/box", nil, 200, &sb)
	if sb.Limits == nil || sb.Limits.DiskBytes != 0 || sb.Limits.MemoryBytes != 67108864 {
		t.Errorf("limits after a refused update: got %+v, want memory_bytes 67108864 and no disk_bytes", sb.Limits)
	}
}
