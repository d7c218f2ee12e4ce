package seccomp

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/agentrunner/runner/internal/testcap"
	"golang.org/x/sys/unix"
)

var probe struct {
	once sync.Once
	path string
	err  error
}

// probePath builds testdata/probe once per test binary, into a directory
// every user can reach (the unprivileged runs exec it).
func probePath(t testing.TB) string {
	t.Helper()
	probe.once.Do(func() {
		dir, err := os.MkdirTemp("", "seccomp-probe")
		if err != nil {
			probe.err = err
			return
		}
		if err := os.Chmod(dir, 0o755); err != nil {
			probe.err = err
			return
		}
		probe.path = filepath.Join(dir, "probe")
		out, err := exec.Command("go", "build", "-o", probe.path, "./testdata/probe").CombinedOutput()
		if err != nil {
			probe.err = fmt.Errorf("go build probe: %v: %s", err, out)
		}
	})
	if probe.err != nil {
		t.Fatal(probe.err)
	}
	return probe.path
}

func TestMain(m *testing.M) {
	code := m.Run()
	if probe.path != "" {
		os.RemoveAll(filepath.Dir(probe.path))
	}
	os.Exit(code)
}

// runProbe runs the probe with args and returns its stdout, stderr and
// exit code.
func runProbe(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(probePath(t), args...)
	cmd.Dir = "/"
	return runCmd(t, cmd)
}

// runCmd runs cmd and returns its stdout, stderr and exit code.
func runCmd(t *testing.T, cmd *exec.Cmd) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("run %v: %v", cmd.Args, err)
	}
	return out.String(), errb.String(), code
}

// parseErrnos reads the attacks mode's "name errno" lines.
func parseErrnos(t *testing.T, out string) map[string]unix.Errno {
	t.Helper()
	m := map[string]unix.Errno{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		name, num, ok := strings.Cut(l, " ")
		n, err := strconv.Atoi(num)
		if !ok || err != nil {
			t.Fatalf("probe line %q", l)
		}
		m[name] = unix.Errno(n)
	}
	return m
}

// gated is what each probe of the attacks mode must get under the filter.
var gated = map[string]unix.Errno{
	"unshare_user": unix.EPERM, "clone_newuser": unix.EPERM, "clone3": unix.ENOSYS, "setns": unix.EPERM,
	"keyctl": unix.EPERM, "add_key": unix.EPERM, "request_key": unix.EPERM,
	"bpf": unix.EPERM, "perf_event_open": unix.EPERM,
	"init_module": unix.EPERM, "finit_module": unix.EPERM, "delete_module": unix.EPERM, "kexec_load": unix.EPERM,
	"reboot": unix.EPERM, "swapon": unix.EPERM,
	"mount": unix.EPERM, "umount2": unix.EPERM, "pivot_root": unix.EPERM,
	"clock_settime": unix.EPERM, "settimeofday": unix.EPERM, "personality": unix.EPERM,
	"io_uring_setup": unix.EPERM, "userfaultfd": unix.EPERM, "open_by_handle_at": unix.EPERM,
	"socket_vsock": unix.EPERM, "socket_alg": unix.EPERM, "syslog": unix.EPERM,
}

// TestGatedCallsAsRoot tries every gated call as root with every
// capability, once without the filter and once under it. Unfiltered, the
// kernel itself answers each (success, or an error of its arguments,
// which are harmless: bad magic, missing paths); under the filter each
// gets the filter's errno, which the unfiltered run shows is not the
// kernel's. Root is the strongest caller: nothing but the filter stands
// between it and these calls.
func TestGatedCallsAsRoot(t *testing.T) {
	testcap.Root(t, "the gated calls must be tried with every capability")
	out, stderr, code := runProbe(t, "attacks")
	if code != 0 {
		t.Fatalf("unfiltered probe: exit %d: %s", code, stderr)
	}
	bare := parseErrnos(t, out)
	out, stderr, code = runProbe(t, "-filter", "attacks")
	if code != 0 {
		t.Fatalf("filtered probe: exit %d: %s", code, stderr)
	}
	filtered := parseErrnos(t, out)
	if len(filtered) != len(gated) || len(bare) != len(gated) {
		t.Fatalf("probes: %d filtered, %d unfiltered, want %d", len(filtered), len(bare), len(gated))
	}
	t.Logf("unfiltered %v", bare)
	for name, want := range gated {
		if got := filtered[name]; got != want {
			t.Errorf("%s under the filter: got %d (%v), want %d (%v)", name, int(got), got, int(want), want)
		}
		if bare[name] == want {
			t.Errorf("%s without the filter: got %d (%v) too; the probe does not reach the kernel's own answer", name, int(bare[name]), bare[name])
		}
	}
}

// TestIsolatedCommand runs the probe as an unprivileged user with
// no_new_privs and the filter, as an isolated command runs: it cannot
// enter a new user namespace (`unshare -U -r`, which works for the same
// user without the filter) nor trace a process that is not its child.
func TestIsolatedCommand(t *testing.T) {
	testcap.Root(t, "the probe switches to an unprivileged user")
	const nobody = "65534"
	_, stderr, code := runProbe(t, "-uid", nobody, "exec", "unshare", "-U", "-r", "true")
	if code != 0 {
		testcap.Skip(t, "userns", "unprivileged user namespaces are off, so the attack cannot be shown to work unfiltered: "+stderr)
	}
	_, stderr, code = runProbe(t, "-uid", nobody, "-filter", "exec", "unshare", "-U", "-r", "true")
	if code != 1 || !strings.Contains(stderr, "Operation not permitted") {
		t.Errorf("unshare -U -r under the filter: exit %d, stderr %q; want exit 1, EPERM", code, stderr)
	}
	// The kernel's check refuses this one (another uid, no CAP_SYS_PTRACE);
	// the filter allows ptrace as Docker does.
	out, stderr, code := runProbe(t, "-uid", nobody, "-filter", "ptrace", strconv.Itoa(os.Getpid()))
	if code != 0 || out != fmt.Sprintf("ptrace %d\n", int(unix.EPERM)) {
		t.Errorf("ptrace of a non-child: %q (exit %d, %s), want ptrace %d", out, code, stderr, int(unix.EPERM))
	}
	out, _, code = runProbe(t, "load-without-nnp")
	if code != 0 || out != "is ErrNoNewPrivs: true\n" {
		t.Errorf("Load without no_new_privs: %q (exit %d), want ErrNoNewPrivs", out, code)
	}
}

// TestWorkloadUnderFilter: what agents run works under the filter, as an
// unprivileged user in a network namespace the test makes (so the ping
// socket's loopback is its own): a Go program's threads, fork and exec,
// files and sockets; a shell's file operations; python3 and git where the
// host has them.
func TestWorkloadUnderFilter(t *testing.T) {
	testcap.Root(t, "the workload runs in a network namespace the test creates")
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		testcap.Skip(t, "util-linux", "no unshare(1) to make the network namespace")
	}
	dir := t.TempDir()
	if err := os.Chmod(filepath.Dir(dir), 0o755); err != nil { // t.TempDir's parent is 0700
		t.Fatal(err)
	}
	if err := os.Chown(dir, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	run := func(t *testing.T, args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.Command(unshare, append([]string{"--net", "--", probePath(t), "-setup-net", "-uid", "65534", "-filter"}, args...)...)
		cmd.Dir = dir
		cmd.Env = []string{"HOME=" + dir, "PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "TMPDIR=" + dir, "LANG=C"}
		return runCmd(t, cmd)
	}
	t.Run("go", func(t *testing.T) {
		out, stderr, code := run(t, "workload")
		want := "ok threads\nok fork_exec\nok files\nok tcp_loopback\nok unix_socketpair\nok netlink_route\nok ping_socket\n"
		if code != 0 || out != want {
			t.Errorf("workload: exit %d, stdout %q, stderr %q; want exit 0, %q", code, out, stderr, want)
		}
	})
	t.Run("shell", func(t *testing.T) {
		script := `set -e
mkdir -p a/b; echo hello > a/b/f; cp a/b/f g; mv g h; chmod 600 h; ln -s h l
cat l; ls a/b; readlink l; stat -c %a h; tar -cf t.tar a; rm -r a; tar -xf t.tar; cat a/b/f
sh -c 'echo $$ >/dev/null; echo child' & wait
echo $(id -u)`
		out, stderr, code := run(t, "exec", "sh", "-c", script)
		want := "hello\nf\nh\n600\nhello\nchild\n65534\n"
		if code != 0 || out != want {
			t.Errorf("shell: exit %d, stdout %q, stderr %q; want %q", code, out, stderr, want)
		}
	})
	t.Run("python3", func(t *testing.T) {
		py := "/usr/bin/python3"
		if _, err := os.Stat(py); err != nil {
			t.Skip("no /usr/bin/python3 on this host")
		}
		src := `import os, socket, subprocess, threading, tempfile
r = []
t = threading.Thread(target=lambda: r.append(sum(range(10)))); t.start(); t.join()
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1); s.close()
with tempfile.NamedTemporaryFile(dir=".") as f: f.write(b"x"); f.flush()
print(r[0], subprocess.run(["echo", "sub"], capture_output=True).stdout.decode().strip(), os.getuid())`
		out, stderr, code := run(t, "exec", py, "-c", src)
		if want := "45 sub 65534\n"; code != 0 || out != want {
			t.Errorf("python3: exit %d, stdout %q, stderr %q; want %q", code, out, stderr, want)
		}
	})
	t.Run("git", func(t *testing.T) {
		if _, err := exec.LookPath("git"); err != nil {
			t.Skip("no git on this host")
		}
		script := `set -e; git init -q -b main repo; cd repo; echo x > f; git add f
git -c user.name=t -c user.email=t@example.invalid commit -q -m one; git log --format=%s; git status --porcelain | wc -l`
		out, stderr, code := run(t, "exec", "sh", "-c", script)
		if want := "one\n0\n"; code != 0 || out != want {
			t.Errorf("git: exit %d, stdout %q, stderr %q; want %q", code, out, stderr, want)
		}
	})
}

// The per-start cost of the filter, for the lead to measure on a quiet
// machine (go test -run '^$' -bench . -count 10 ./seccomp/):
// BenchmarkExecTrue is a plain fork/exec of /bin/true, the baseline;
// BenchmarkHelperPlain a Go helper (the probe) that execs /bin/true;
// BenchmarkHelperFiltered the same helper compiling and loading the filter
// first, as the shim's nsexec helper does; BenchmarkCompile the
// compile alone, in-process (the load is the rest of the difference: a
// loaded filter cannot be removed, so it is never loaded in the
// benchmark's own process).
func BenchmarkExecTrue(b *testing.B) {
	for b.Loop() {
		if err := exec.Command("/bin/true").Run(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkHelperPlain(b *testing.B)    { benchHelper(b, "exec", "/bin/true") }
func BenchmarkHelperFiltered(b *testing.B) { benchHelper(b, "-filter", "exec", "/bin/true") }

func benchHelper(b *testing.B, args ...string) {
	path := probePath(b)
	for b.Loop() {
		if out, err := exec.Command(path, args...).CombinedOutput(); err != nil {
			b.Fatalf("%v: %s", err, out)
		}
	}
}

func BenchmarkCompile(b *testing.B) {
	for b.Loop() {
		if _, err := Default(); err != nil {
			b.Fatal(err)
		}
	}
}
