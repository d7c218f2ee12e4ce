package shim

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/shim/internal/shimtest"
	"github.com/agentrunner/runner/shim/launch"
	"github.com/agentrunner/runner/shim/sessiondir"
	"golang.org/x/sys/unix"
)

// Spec.ResolvConf tests. They need root (mount namespaces, setuid) and
// change nothing outside the namespaces and files they create: the test
// checks the host's /etc/resolv.conf and this process's mount table
// before and after.

// hostMounts is the host's /etc/resolv.conf and this process's mount
// table, to compare before and after.
func hostMounts(t *testing.T) string {
	t.Helper()
	rc, err := os.ReadFile("/etc/resolv.conf")
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	// Parallel tests of this package mount and unmount under their own
	// temporary directories (tmpfs for the disk-full tests, namespace
	// files): those come and go during this test and say nothing about a
	// leak of ours, which would show on /etc/resolv.conf or elsewhere.
	tmp := os.TempDir() + "/"
	var kept []string
	for _, line := range strings.Split(string(mi), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], tmp) {
			continue
		}
		kept = append(kept, line)
	}
	return "resolv.conf:\n" + string(rc) + "mountinfo:\n" + strings.Join(kept, "\n")
}

func TestResolvConf(t *testing.T) {
	shimtest.NeedRoot(t)
	nsPath, ino := shimtest.NewNetNS(t)
	conf, content := shimtest.ResolvFixture(t)
	before := hostMounts(t)
	hostMnt := nsLink(t, "/proc/self/ns/mnt")
	t.Cleanup(func() {
		// Registered after newNetNS's unmount, so it runs before it.
		if after := hostMounts(t); after != before {
			t.Errorf("host's resolv.conf or mount table changed:\nbefore:\n%s\nafter:\n%s", before, after)
		}
	})

	t.Run("root", func(t *testing.T) {
		script := `echo $$; cat /etc/resolv.conf; readlink /proc/self/ns/net
if echo x >>/etc/resolv.conf; then echo WRITABLE; fi; read x; exit 3`
		dir, st := shimtest.Start(t, sessiondir.Spec{Argv: []string{"sh", "-c", script}, NetNS: nsPath, ResolvConf: conf})
		want := fmt.Sprintf("%d\n%snet:[%d]\n", st.PID, content, ino)
		waitOutput(t, dir, want)
		// The reported pid is the command (sh), a session leader, in its
		// own mount namespace; the shim stayed in the host's.
		if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", st.PID)); string(comm) != "sh\n" {
			t.Errorf("pid %d runs %q, want sh", st.PID, comm)
		}
		if sid, err := unix.Getsid(st.PID); err != nil || sid != st.PID {
			t.Errorf("session of pid %d: got %d (%v), want the pid itself", st.PID, sid, err)
		}
		if m := nsLink(t, fmt.Sprintf("/proc/%d/ns/mnt", st.PID)); m == hostMnt {
			t.Errorf("the command is in the host's mount namespace %s", m)
		}
		if m := nsLink(t, fmt.Sprintf("/proc/%d/ns/mnt", st.ShimPID)); m != hostMnt {
			t.Errorf("the shim is in mount namespace %s, want the host's %s", m, hostMnt)
		}
		c := shimtest.Dial(t, dir)
		if err := c.CloseStdin(shimtest.CtxT(t, 5*time.Second)); err != nil {
			t.Fatal(err)
		}
		if e := shimtest.WaitExit(t, dir); e.Code != 3 {
			t.Fatalf("exit: got %+v, want 3", e)
		}
		if out := shimtest.StdoutOf(t, dir); out != want {
			t.Errorf("stdout: got %q, want %q (and /etc/resolv.conf read-only)", out, want)
		}
		if b, _ := shimtest.ReadStream(dir, "stderr"); !strings.Contains(string(b), "Read-only file system") {
			t.Errorf("stderr: got %q, want the write refused as read-only", b)
		}
	})

	t.Run("tty", func(t *testing.T) {
		dir, st := shimtest.Start(t, sessiondir.Spec{Argv: []string{"sh", "-c", `echo $$; cat /etc/resolv.conf; tty`}, TTY: true, NetNS: nsPath, ResolvConf: conf})
		shimtest.WaitExit(t, dir)
		out := strings.ReplaceAll(shimtest.StdoutOf(t, dir), "\r\n", "\n")
		if want := fmt.Sprintf("%d\n%s/dev/pts/", st.PID, content); !strings.HasPrefix(out, want) {
			t.Errorf("stdout: got %q, want prefix %q", out, want)
		}
	})

	// The helper must leave the command exactly as a direct start would:
	// user, groups, signal state, descriptors, limits, directory and
	// environment; only /etc/resolv.conf differs.
	t.Run("nobody, same as a direct start", func(t *testing.T) {
		probe := `id -u; id -g; id -G; cat /etc/resolv.conf; grep -E '^(Sig(Blk|Ign)|NoNewPrivs|Cap(Inh|Prm|Eff|Bnd|Amb)):' /proc/self/status
ls /proc/self/fd; ulimit -n; pwd; env | sort`
		spec := sessiondir.Spec{Argv: []string{"sh", "-c", probe}, User: "nobody", Dir: "/", NetNS: nsPath, Env: append([]string{"X=1", "X=2"}, shimtest.TestEnv...)}
		direct, _ := shimtest.Start(t, spec)
		shimtest.WaitExit(t, direct)
		spec.ResolvConf = conf
		helped, _ := shimtest.Start(t, spec)
		if e := shimtest.WaitExit(t, helped); e.Code != 0 {
			b, _ := shimtest.ReadStream(helped, "stderr")
			t.Fatalf("exit %+v, stderr %q", e, b)
		}
		got, base := shimtest.StdoutOf(t, helped), shimtest.StdoutOf(t, direct)
		if !strings.HasPrefix(got, "65534\n") || !strings.Contains(got, content) {
			t.Errorf("as nobody: got %q, want uid 65534 and the file's content", got)
		}
		hostRC, _ := os.ReadFile("/etc/resolv.conf")
		if want := strings.Replace(base, string(hostRC), content, 1); got != want {
			t.Errorf("through the helper:\n%s\nwant (a direct start, resolv.conf replaced):\n%s", got, want)
		}
	})

	t.Run("start errors", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			spec sessiondir.Spec
			want error
			msg  string
		}{
			{"missing argv0", sessiondir.Spec{Argv: []string{"/nonexistent/bin"}, ResolvConf: conf}, fs.ErrNotExist, "/nonexistent/bin"},
			{"missing argv0 on PATH", sessiondir.Spec{Argv: []string{"no-such-command-xyz"}, ResolvConf: conf, User: "nobody"}, fs.ErrNotExist, "no-such-command-xyz"},
			{"missing resolv_conf", sessiondir.Spec{Argv: []string{"true"}, ResolvConf: "/nonexistent/resolv.conf", NetNS: nsPath}, fs.ErrNotExist, "bind-mount /nonexistent/resolv.conf"},
			{"missing cwd", sessiondir.Spec{Argv: []string{"true"}, ResolvConf: conf, Dir: "/nonexistent-dir"}, fs.ErrNotExist, "chdir /nonexistent-dir"},
			{"not executable", sessiondir.Spec{Argv: []string{conf}, ResolvConf: conf}, fs.ErrPermission, conf},
			{"relative resolv_conf", sessiondir.Spec{Argv: []string{"true"}, ResolvConf: "resolv.conf"}, sessiondir.ErrInvalid, "not an absolute path"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				tc.spec.ID, tc.spec.Env = "x", shimtest.TestEnv
				_, err := shimtest.ColdStart(shimtest.CtxT(t, 10*time.Second), shimtest.ShimExe, shimtest.SessionDir(t), tc.spec)
				if !errors.Is(err, tc.want) || !strings.Contains(fmt.Sprint(err), tc.msg) {
					t.Fatalf("got %v, want an error matching %v that names %q", err, tc.want, tc.msg)
				}
				var se *launch.StartError
				if errors.As(err, &se) {
					shimtest.WaitGone(t, se.ShimPID)
				} else if tc.want != sessiondir.ErrInvalid {
					t.Fatalf("got %T, want a *StartError", err)
				}
			})
		}
	})
}

// TestNsexecReport pins the helper's report protocol.
func TestNsexecReport(t *testing.T) {
	for _, tc := range []struct {
		rep   string
		ok    bool
		errno syscall.Errno
	}{
		{"exec\n", true, 0},
		{"", false, 0},
		{"exec\nerror 2 exec /x\n", false, syscall.ENOENT},
		{"error 1 nsexec: unshare mount namespace\n", false, syscall.EPERM},
		{"error 0 nsexec helper: panic: boom\n", false, 0},
		{"garbage", false, 0},
	} {
		err := parseNsexecReport(tc.rep)
		if (err == nil) != tc.ok {
			t.Errorf("report %q: got %v, want ok=%v", tc.rep, err, tc.ok)
			continue
		}
		if tc.errno != 0 && !errors.Is(err, tc.errno) {
			t.Errorf("report %q: got %v, want errno %v", tc.rep, err, tc.errno)
		}
	}
}

// TestBinds: with Spec.Binds of a directory's tmp, var-tmp and shm over
// /tmp, /var/tmp and /dev/shm (as runnerd makes a sandbox's private ones),
// a command (as nobody, isolated or not) writes there, never the host's,
// and sees none of the host's files; the sources lie under /tmp, which
// the first bind replaces (each is opened before any mount). A missing
// source fails the start. The host's mount table does not change.
func TestBinds(t *testing.T) {
	shimtest.NeedRoot(t)
	before := hostMounts(t)
	priv := t.TempDir()
	if err := os.Chmod(priv, 0o755); err != nil {
		t.Fatal(err)
	}
	binds := []sessiondir.Bind{{Source: priv + "/tmp", Target: "/tmp"}, {Source: priv + "/var-tmp", Target: "/var/tmp"}, {Source: priv + "/shm", Target: "/dev/shm"}}
	for _, b := range binds {
		if err := os.Mkdir(b.Source, 0o777|os.ModeSticky); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(b.Source, 0o777|os.ModeSticky); err != nil {
			t.Fatal(err)
		}
	}
	name := fmt.Sprintf("runner-binds-%d", time.Now().UnixNano())
	// A host file in each target: the command must not see it.
	for _, b := range binds {
		host := filepath.Join(b.Target, name+"-host")
		if err := os.WriteFile(host, []byte("host\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(host) })
	}
	script := fmt.Sprintf(`for d in /tmp /var/tmp /dev/shm; do echo "$d" > "$d/%[1]s" || exit 1; cat "$d/%[1]s-host" 2>/dev/null && exit 2; done; echo ok`, name)
	for _, isolate := range []bool{false, true} {
		out, code := runToEnd(t, sessiondir.Spec{Argv: []string{"sh", "-c", script}, User: "nobody", Isolate: isolate, Binds: binds})
		if code != 0 || out != "ok\n" {
			t.Fatalf("isolate %v: exit %d output %q, want 0 and ok (the host's files unseen)", isolate, code, out)
		}
		for _, b := range binds {
			got, err := os.ReadFile(filepath.Join(b.Source, name))
			if err != nil || string(got) != b.Target+"\n" {
				t.Errorf("isolate %v: %s/%s: %q, %v; want %q", isolate, b.Source, name, got, err, b.Target+"\n")
			}
			if _, err := os.Stat(filepath.Join(b.Target, name)); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("isolate %v: the host's %s/%s: %v, want it absent", isolate, b.Target, name, err)
			}
			os.Remove(filepath.Join(b.Source, name))
		}
	}
	if after := hostMounts(t); after != before {
		t.Errorf("host mounts changed:\nbefore %s\nafter %s", before, after)
	}
	if err := os.Remove(binds[2].Source); err != nil {
		t.Fatal(err)
	}
	dir := shimtest.SessionDir(t)
	spec := sessiondir.Spec{ID: "t1", Env: shimtest.TestEnv, Argv: []string{"true"}, User: "nobody", Isolate: true, Binds: binds}
	_, err := shimtest.ColdStart(shimtest.CtxT(t, 10*time.Second), shimtest.ShimExe, dir, spec)
	var se *launch.StartError
	if !errors.As(err, &se) || !errors.Is(err, unix.ENOENT) {
		t.Fatalf("start without %s: %v, want a StartError wrapping ENOENT", binds[2].Source, err)
	}
}

// TestBindFileReadOnly: a file bound over a file with ReadOnly (as
// runnerd binds an isolated sandbox's /etc/passwd) is what the command
// reads there, and not writable even by root in the namespace; a file over
// a directory fails the start. The host's file does not change.
func TestBindFileReadOnly(t *testing.T) {
	shimtest.NeedRoot(t)
	before := hostMounts(t)
	src := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(src, []byte("10.9.9.9 bound\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	host, err := os.ReadFile("/etc/hosts")
	if err != nil {
		t.Fatal(err)
	}
	binds := []sessiondir.Bind{{Source: src, Target: "/etc/hosts", ReadOnly: true}}
	// Root without Isolate: only the read-only mount stops the write.
	out, code := runToEnd(t, sessiondir.Spec{Argv: []string{"sh", "-c", `cat /etc/hosts; echo x >> /etc/hosts && echo written`}, Binds: binds})
	if code == 0 || !strings.HasPrefix(out, "10.9.9.9 bound\n") || strings.Contains(out, "written") {
		t.Fatalf("exit %d output %q, want the bound file and a refused write", code, out)
	}
	if got, _ := os.ReadFile(src); string(got) != "10.9.9.9 bound\n" {
		t.Errorf("the source changed: %q", got)
	}
	if now, _ := os.ReadFile("/etc/hosts"); !bytes.Equal(now, host) {
		t.Errorf("the host's /etc/hosts changed")
	}
	if after := hostMounts(t); after != before {
		t.Errorf("host mounts changed:\nbefore %s\nafter %s", before, after)
	}
	spec := sessiondir.Spec{ID: "t1", Env: shimtest.TestEnv, Argv: []string{"true"}, Binds: []sessiondir.Bind{{Source: src, Target: "/tmp", ReadOnly: true}}}
	_, err = shimtest.ColdStart(shimtest.CtxT(t, 10*time.Second), shimtest.ShimExe, shimtest.SessionDir(t), spec)
	var se *launch.StartError
	if !errors.As(err, &se) || !errors.Is(err, unix.ENOTDIR) {
		t.Fatalf("a file over a directory: %v, want a StartError wrapping ENOTDIR", err)
	}
}

// TestHostname: with Spec.Hostname a command (isolated, as nobody) runs in
// a UTS namespace of its own with that name; the host's is unchanged, and
// a name sethostname(2) would not take is refused (ErrInvalid).
func TestHostname(t *testing.T) {
	shimtest.NeedRoot(t)
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	out, code := runToEnd(t, sessiondir.Spec{Argv: []string{"cat", "/proc/sys/kernel/hostname"}, User: "nobody", Isolate: true, Hostname: "sbx-hostname-test"})
	if code != 0 || out != "sbx-hostname-test\n" {
		t.Fatalf("hostname inside: %q exit %d, want sbx-hostname-test", out, code)
	}
	if now, _ := os.Hostname(); now != host {
		t.Errorf("the host's name changed: %q, was %q", now, host)
	}
	for _, bad := range []string{"a b", "x/y", strings.Repeat("a", 65)} {
		spec := sessiondir.Spec{ID: "t1", Env: shimtest.TestEnv, Argv: []string{"true"}, Hostname: bad}
		if err := spec.Validate(); !errors.Is(err, sessiondir.ErrInvalid) {
			t.Errorf("hostname %q: %v, want ErrInvalid", bad, err)
		}
	}
}
