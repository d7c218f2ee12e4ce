package shim

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentrunner/runner/internal/testcap"
	"github.com/agentrunner/runner/journal"
	"github.com/agentrunner/runner/pod"
	"github.com/agentrunner/runner/shim/internal/shimtest"
)

// newPodWith is newPod with edit applied to the Config before Create.
func newPodWith(t *testing.T, name string, k int, edit func(*pod.Config)) *testPod {
	t.Helper()
	shimtest.NeedRoot(t)
	root := t.TempDir()
	cfg := pod.Config{Holder: []string{"/proc/self/exe", "pod"}, Env: []string{shimtest.AsShimEnv + "=1", "GORACE=atexit_sleep_ms=0"},
		Name: name, UIDBase: podBase + uint32(k)*pod.BlockSize}
	for _, d := range []*string{&cfg.Upper, &cfg.Workspace, &cfg.Tmp, &cfg.VarTmp} {
		dir, err := os.MkdirTemp(root, "d")
		if err != nil {
			t.Fatal(err)
		}
		*d = dir
	}
	edit(&cfg)
	p, err := pod.Create(shimtest.CtxT(t, 30*time.Second), cfg)
	if err != nil {
		t.Fatalf("pod.Create: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Destroy(shimtest.CtxT(t, 30*time.Second)); err != nil {
			t.Errorf("Destroy: %v", err)
		}
	})
	return &testPod{p, cfg}
}

// TestPodBindRemount: a command in a pod (a session: seccomp filter,
// no_new_privs, root of the pod's user namespace) cannot make an
// operator's read-only bind writable: `mount -o remount,bind,rw` is
// refused (the filter: no mount call), and a write after it still gets
// EROFS, though the host's file is writable by anybody.
func TestPodBindRemount(t *testing.T) {
	src := t.TempDir()
	os.Chmod(src, 0o777)
	f := filepath.Join(src, "f")
	if err := os.WriteFile(f, []byte("data\n"), 0o666); err != nil {
		t.Fatal(err)
	}
	os.Chmod(f, 0o666)
	p := newPodWith(t, "remount", 40, func(c *pod.Config) { c.Binds = []pod.Bind{{Source: src, Target: "/opt/data"}} })
	e, out := runIn(t, p, `mount -o remount,bind,rw /opt/data 2>/dev/null; echo remount $?; mount -o remount,rw /opt/data 2>/dev/null; echo remount-sb $?
umount /opt/data 2>/dev/null; echo umount $?; echo x > /opt/data/f; cat /opt/data/f`)
	want := "remount 32\nremount-sb 32\numount 32\nsh: 2: cannot create /opt/data/f: Read-only file system\ndata\n"
	if e.Reason != journal.ReasonExited || out != want {
		t.Errorf("got %+v\n%s\nwant\n%s", e, out, want)
	}
	if b, _ := os.ReadFile(f); string(b) != "data\n" {
		t.Errorf("the host's file: %q, want it unchanged", b)
	}
}

// TestPodAptSession: apt-get installs a .deb from the workspace in a
// session (under the seccomp filter and no_new_privs, as every command
// runs), its postinst editing /etc; the host is untouched.
func TestPodAptSession(t *testing.T) {
	for _, tool := range []string{"dpkg-deb", "apt-get", "add-shell"} {
		if _, err := exec.LookPath(tool); err != nil {
			testcap.Skip(t, tool, "the pod's apt test builds and installs a .deb (a Debian host has dpkg, apt and debianutils)")
		}
	}
	const name = "runner-podtest-session"
	pkg := filepath.Join(t.TempDir(), "pkg")
	for f, body := range map[string]string{
		"DEBIAN/control":                   "Package: " + name + "\nVersion: 1.0\nArchitecture: all\nMaintainer: runner tests <t@example.invalid>\nDescription: a test package\n",
		"DEBIAN/postinst":                  "#!/bin/sh\nset -e\n[ \"$1\" != configure ] || add-shell /usr/local/bin/" + name + "\n",
		"usr/local/bin/" + name:            "#!/bin/sh\nexec /bin/sh \"$@\"\n",
		"usr/local/share/" + name + "/doc": "installed\n",
	} {
		p := filepath.Join(pkg, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	p := newPodWith(t, "aptsession", 41, func(*pod.Config) {})
	if out, err := exec.Command("dpkg-deb", "--root-owner-group", "--build", pkg, filepath.Join(p.cfg.Workspace, "x.deb")).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb: %v %s", err, out)
	}
	e, out := runIn(t, p, `export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive
apt-get install -y /workspace/x.deb >/workspace/apt.log 2>&1; echo apt $?
dpkg-query -W -f='${Status}\n' `+name+`; cat /usr/local/share/`+name+`/doc; grep -c /usr/local/bin/`+name+` /etc/shells`)
	if want := "apt 0\ninstall ok installed\ninstalled\n1\n"; e.Code != 0 || out != want {
		log, _ := os.ReadFile(filepath.Join(p.cfg.Workspace, "apt.log"))
		t.Errorf("got %+v %q, want %q; apt-get said:\n%s", e, out, want, log)
	}
	if _, err := os.Lstat("/usr/local/share/" + name); !os.IsNotExist(err) {
		t.Errorf("the host's /usr/local/share/%s: %v, want absent", name, err)
	}
}

// TestPodSessionPTY: a command in a pod (under the filter) can make a
// pseudo-terminal of the pod's own devpts (script, tmux, expect).
func TestPodSessionPTY(t *testing.T) {
	p := newPodWith(t, "pty", 42, func(*pod.Config) {})
	e, out := runIn(t, p, `script -qc tty /dev/null </dev/null | tr -d '\r'`)
	if want := "/dev/pts/0\n"; e.Code != 0 || out != want {
		t.Errorf("got %+v %q, want %q", e, out, want)
	}
}
