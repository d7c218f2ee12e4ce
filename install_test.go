package runner

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/internal/testcap"
)

// TestInstallScript stages images/install.sh into a temporary root, the way
// a packager would, and checks that it installs the three binaries and a
// unit that starts runnerd without ever killing session shims.
func TestInstallScript(t *testing.T) {
	if testing.Short() {
		t.Skip("builds three binaries")
	}
	root := t.TempDir()
	cmd := exec.Command("bash", "images/install.sh", "--no-start")
	cmd.Env = append(os.Environ(), "DESTDIR="+root, "BINDIR=/opt/runner/bin")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("install.sh: %v\n%s", err, out)
	}
	for _, b := range []string{"runnerd", "runner", "runner-shim"} {
		fi, err := os.Stat(filepath.Join(root, "opt/runner/bin", b))
		if err != nil {
			t.Fatalf("binary %s not installed: %v", b, err)
		}
		if fi.Mode().Perm() != 0o755 {
			t.Errorf("%s mode = %v, want 0755", b, fi.Mode().Perm())
		}
	}
	out, err := exec.Command(filepath.Join(root, "opt/runner/bin/runnerd"), "--help").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Usage: runnerd") {
		t.Errorf("installed runnerd --help: %v\n%s", err, out)
	}
	unit, err := os.ReadFile(filepath.Join(root, "etc/systemd/system/runnerd.service"))
	if err != nil {
		t.Fatalf("unit not installed: %v", err)
	}
	for _, want := range []string{
		"ExecStart=/opt/runner/bin/runnerd --shim /opt/runner/bin/runner-shim $RUNNERD_ARGS\n", // BINDIR is honoured
		"Type=notify\n",
		"KillMode=process\n", // stopping runnerd must not kill the turns
		"StateDirectory=runnerd\n",
	} {
		if !strings.Contains(string(unit), want) {
			t.Errorf("installed unit lacks %q", strings.TrimSpace(want))
		}
	}
}

// TestInstallFromForeignCheckout runs install.sh as root from a checkout
// owned by another user, the usual `sudo images/install.sh` case, where Go's
// own VCS stamping fails on git's safe.directory check. The binaries must
// build and carry the checkout's version, in the form a go build of it has.
func TestInstallFromForeignCheckout(t *testing.T) {
	if testing.Short() {
		t.Skip("builds three binaries")
	}
	testcap.Root(t, "the checkout is chowned to another user and installed from as root")
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("needs git")
	}
	if _, err := os.Stat(".git"); err != nil {
		t.Skip("not run from a git checkout")
	}
	src := filepath.Join(t.TempDir(), "runner")
	if out, err := exec.Command("git", "clone", "-q", "--no-hardlinks", ".", src).CombinedOutput(); err != nil {
		t.Fatalf("git clone: %v\n%s", err, out)
	}
	if out, err := exec.Command("chown", "-R", "65534:65534", src).CombinedOutput(); err != nil {
		t.Fatalf("chown: %v\n%s", err, out)
	}
	// The version a go build of this clean clone has too (package
	// version): its vX.Y.Z tag, else dev-<12 hex of the commit>.
	rev, err := exec.Command("git", "-c", "safe.directory="+src, "-C", src, "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatalf("git rev-parse: %v", err)
	}
	want := []byte("dev-" + string(rev[:12]))
	tags, _ := exec.Command("git", "-c", "safe.directory="+src, "-C", src, "tag", "--points-at", "HEAD").Output()
	for _, tag := range strings.Fields(string(tags)) {
		if regexp.MustCompile(`^v[0-9]+\.[0-9]+\.[0-9]+$`).MatchString(tag) {
			want = []byte(tag) // install.sh takes the highest; a test checkout has one at most
		}
	}
	root := t.TempDir()
	cmd := exec.Command("bash", filepath.Join(src, "images/install.sh"), "--no-start")
	cmd.Env = append(os.Environ(), "DESTDIR="+root, "GOFLAGS=-buildvcs=auto") // a host whose Go env sets -buildvcs=false would hide the bug
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("install.sh from a checkout owned by uid 65534: %v\n%s", err, out)
	}
	for _, b := range []string{"runnerd", "runner-shim"} {
		out, err := exec.Command(filepath.Join(root, "usr/local/bin", b), "--version").Output()
		if err != nil {
			t.Fatalf("%s --version: %v", b, err)
		}
		if got := strings.TrimSpace(string(out)); got != strings.TrimSpace(string(want)) {
			t.Errorf("%s --version = %q, want %q", b, got, strings.TrimSpace(string(want)))
		}
	}
	// runner prints its own version first, then asks the daemon (none here).
	out, _ := exec.Command(filepath.Join(root, "usr/local/bin", "runner"), "--version").Output()
	if got, want := strings.SplitN(string(out), "\n", 2)[0], "client: "+strings.TrimSpace(string(want)); got != want {
		t.Errorf("runner --version: first line %q, want %q", got, want)
	}
	if _, err := os.Stat(filepath.Join(root, "usr/local/share/doc/runner/operations.md")); err != nil {
		t.Errorf("the unit's Documentation= page is not installed: %v", err)
	}
}

// TestInstalledShim starts the installed runnerd the way the unit does
// (--shim runner-shim) and checks that a session's supervisor is that
// binary, not a re-executed runnerd.
func TestInstalledShim(t *testing.T) {
	if testing.Short() {
		t.Skip("builds three binaries")
	}
	root := t.TempDir()
	inst := exec.Command("bash", "images/install.sh", "--no-start")
	inst.Env = append(os.Environ(), "DESTDIR="+root, "BINDIR=/bin")
	if out, err := inst.CombinedOutput(); err != nil {
		t.Fatalf("install.sh: %v\n%s", err, out)
	}
	bin := filepath.Join(root, "bin")
	state := t.TempDir()
	// As root the sandbox runs as a uid of its own (--isolate all), which
	// must pass t.TempDir's parent (0700) to reach its workspace.
	if err := os.Chmod(filepath.Dir(state), 0o711); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	d := exec.Command(filepath.Join(bin, "runnerd"), "--state", state, "--listen", addr, "--socket", "none",
		"--netpolicy", "off", "--cgroups", "off", // the default cgroup root is another test runnerd's to claim
		"--shim", filepath.Join(bin, "runner-shim"))
	d.Env = append(os.Environ(), "RUNNERD_TOKEN=install-test-token")
	var logs bytes.Buffer
	d.Stdout, d.Stderr = &logs, &logs
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Process.Signal(syscall.SIGTERM); d.Wait() })
	call := func(method, path, body string, out any) int {
		t.Helper()
		req, _ := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer install-test-token")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0
		}
		defer resp.Body.Close()
		if out != nil {
			json.NewDecoder(resp.Body).Decode(out)
		}
		return resp.StatusCode
	}
	for deadline := time.Now().Add(20 * time.Second); call("GET", "/healthz", "", nil) != 200; {
		if time.Now().After(deadline) {
			t.Fatalf("installed runnerd did not serve:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code := call("POST", "/v1/sandboxes", `{"name":"inst"}`, nil); code != 200 {
		t.Fatalf("create sandbox: %d\n%s", code, logs.String())
	}
	var sess struct{ PID int }
	if code := call("POST", "/v1/sandboxes/inst/sessions", `{"id":"s","argv":["sleep","60"]}`, &sess); code != 201 || sess.PID == 0 {
		t.Fatalf("spawn: %d %+v\n%s", code, sess, logs.String())
	}
	t.Cleanup(func() { call("DELETE", "/v1/sandboxes/inst", "", nil) })
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", sess.PID))
	if err != nil {
		t.Fatal(err)
	}
	// The parent pid is the 4th field, after "(comm)".
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	exe, err := os.Readlink("/proc/" + fields[1] + "/exe")
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(bin, "runner-shim"); exe != want {
		t.Errorf("the session's supervisor runs %s, want %s", exe, want)
	}
}

// TestInstallHelp: install.sh --help prints its header comment and nothing
// of the script itself (it used to print its own `set -euo pipefail`).
func TestInstallHelp(t *testing.T) {
	out, err := exec.Command("bash", "images/install.sh", "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("install.sh --help: %v\n%s", err, out)
	}
	if !strings.HasPrefix(string(out), "Install runner on a Linux host") {
		t.Errorf("install.sh --help does not start with the header:\n%s", out)
	}
	for _, bad := range []string{"set -", "start=", "case "} {
		if strings.Contains(string(out), bad) {
			t.Errorf("install.sh --help prints script text %q:\n%s", bad, out)
		}
	}
}
