package pod

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/internal/testcap"
)

// debName is the package the apt tests build and install.
const debName = "runner-podtest"

// buildDeb builds a tiny .deb with dpkg-deb: a file under
// /usr/local/share, a shell under /usr/local/bin, and a postinst that
// edits /etc as postinsts do (add-shell rewrites /etc/shells, a line is
// appended to it in place, a new /etc file) with a postrm that undoes
// it, and returns its path.
func buildDeb(t *testing.T) string {
	t.Helper()
	for _, tool := range []string{"dpkg-deb", "apt-get", "add-shell"} {
		if _, err := exec.LookPath(tool); err != nil {
			testcap.Skip(t, tool, "the pod's apt test builds and installs a .deb (a Debian host has dpkg, apt and debianutils)")
		}
	}
	dir := t.TempDir()
	files := map[string]string{
		"DEBIAN/control": "Package: " + debName + "\nVersion: 1.0\nArchitecture: all\nMaintainer: runner tests <t@example.invalid>\n" +
			"Description: a package the pod tests install\n",
		"DEBIAN/postinst": "#!/bin/sh\nset -e\nif [ \"$1\" = configure ]; then\n  echo '# added by " + debName + "' >> /etc/shells\n" +
			"  add-shell /usr/local/bin/" + debName + "-sh\n  echo configured > /etc/" + debName + ".conf\nfi\n",
		"DEBIAN/postrm": "#!/bin/sh\nset -e\nif [ \"$1\" = remove ] || [ \"$1\" = purge ]; then\n  remove-shell /usr/local/bin/" + debName +
			"-sh\n  sed -i '/# added by " + debName + "/d' /etc/shells\n  rm -f /etc/" + debName + ".conf\nfi\n",
		"usr/local/share/" + debName + "/hello": "hello from a package\n",
		"usr/local/bin/" + debName + "-sh":      "#!/bin/sh\nexec /bin/sh \"$@\"\n",
	}
	for name, body := range files {
		p := filepath.Join(dir, "pkg", name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		mode := os.FileMode(0o644)
		if strings.HasPrefix(name, "DEBIAN/post") || strings.Contains(name, "/bin/") {
			mode = 0o755
		}
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
	}
	deb := filepath.Join(dir, debName+".deb")
	if out, err := exec.Command("dpkg-deb", "--root-owner-group", "--build", filepath.Join(dir, "pkg"), deb).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb --build: %v\n%s", err, out)
	}
	return deb
}

// placeDeb copies the .deb into the pod's workspace (as the host's root:
// the pod reads it as others may).
func placeDeb(t *testing.T, deb string, cfg Config) {
	t.Helper()
	b, err := os.ReadFile(deb)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cfg.Workspace, "x.deb"), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// installedCheck is a script whose output says what of the package a
// pod has: dpkg's status, its files, its postinst's edits.
const installedCheck = `dpkg-query -W -f='${Status}\n' ` + debName + ` 2>&1 | sed 's/^dpkg-query: no packages found.*/not installed/'
cat /usr/local/share/` + debName + `/hello 2>&1 | sed 's/.*No such file.*/no file/'
grep -c /usr/local/bin/` + debName + `-sh /etc/shells
grep -c '^# added by ` + debName + `$' /etc/shells
cat /etc/` + debName + `.conf 2>/dev/null || echo no conf
`

const installedOut = "install ok installed\nhello from a package\n1\n1\nconfigured\n"
const absentOut = "not installed\nno file\n0\n0\nno conf\n"

// TestPodAptInstall: root inside installs a .deb placed in the
// workspace with apt-get, offline: exit 0, dpkg says installed, its
// files are there and its postinst edited /etc (a host file, /etc/shells,
// and a new one). On the host everything landed in the pod's upper
// directory, owned by the block's ids, and nothing in the host's /usr,
// /etc or dpkg database; another pod does not have it; the pod made
// again on the same upper directory (park and resume, a restart) still
// has it.
func TestPodAptInstall(t *testing.T) {
	deb := buildDeb(t)
	cfg := newConfig(t, "apt", 20)
	placeDeb(t, deb, cfg)
	shellsBefore, err := os.ReadFile("/etc/shells")
	if err != nil {
		t.Fatal(err)
	}
	p, err := Create(ctxT(t, 30*time.Second), cfg)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if out, err := inPod(t, p, installedCheck); out != absentOut {
		t.Fatalf("before the install: got %q (%v), want %q", out, err, absentOut)
	}
	out, err := inPod(t, p, "DEBIAN_FRONTEND=noninteractive apt-get install -y /workspace/x.deb")
	if err != nil {
		t.Fatalf("apt-get install in the pod: %v\n%s", err, out)
	}
	if out, err := inPod(t, p, installedCheck); out != installedOut {
		t.Errorf("after the install: got %q (%v), want %q", out, err, installedOut)
	}

	// The host has none of it.
	for _, f := range []string{"/usr/local/share/" + debName, "/usr/local/bin/" + debName + "-sh", "/etc/" + debName + ".conf",
		"/var/lib/dpkg/info/" + debName + ".list", "/var/lib/dpkg/info/" + debName + ".postinst"} {
		if _, err := os.Lstat(f); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the host's %s: %v, want absent", f, err)
		}
	}
	if shells, _ := os.ReadFile("/etc/shells"); string(shells) != string(shellsBefore) {
		t.Errorf("the host's /etc/shells changed: %q", shells)
	}
	if out, err := exec.Command("dpkg-query", "-W", debName).CombinedOutput(); err == nil {
		t.Errorf("the host's dpkg knows %s: %s", debName, out)
	}
	// The pod's upper directory has all of it, owned by the block's ids.
	for _, f := range []string{"usr/upper/local/share/" + debName + "/hello", "usr/upper/local/bin/" + debName + "-sh",
		"etc/upper/shells", "etc/upper/" + debName + ".conf", "var%2Flib%2Fdpkg/upper/status",
		"var%2Flib%2Fdpkg/upper/info/" + debName + ".list"} {
		var st syscall.Stat_t
		if err := syscall.Lstat(filepath.Join(cfg.Upper, f), &st); err != nil || st.Uid != cfg.UIDBase || st.Gid != cfg.UIDBase {
			t.Errorf("upper %s: owner %d:%d (%v), want %d:%d", f, st.Uid, st.Gid, err, cfg.UIDBase, cfg.UIDBase)
		}
	}

	// Another pod (its own upper directory) does not have it.
	other := create(t, newConfig(t, "apt-other", 21))
	if out, err := inPod(t, other, installedCheck); out != absentOut {
		t.Errorf("in another pod: got %q (%v), want %q", out, err, absentOut)
	}

	// The pod ended and made again on the same directories.
	if err := p.Destroy(ctxT(t, 30*time.Second)); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	again := create(t, cfg)
	if out, err := inPod(t, again, installedCheck); out != installedOut {
		t.Errorf("the pod made again on its upper directory: got %q (%v), want %q", out, err, installedOut)
	}
	// And dpkg there removes it again (its database is consistent; the
	// postrm edits /etc back).
	if out, err := inPod(t, again, "dpkg --purge "+debName+" >/dev/null 2>&1 && "+installedCheck); out != absentOut {
		t.Errorf("after dpkg --purge: got %q (%v), want %q", out, err, absentOut)
	}
}

// TestPodVarAndRun: the pod's /var shows the host's package state (dpkg,
// apt) and nothing else of the host's /var/lib, /var/log or /var/cache;
// /run is a fresh tmpfs with /run/lock; /root and /home are the pod's
// own, empty.
func TestPodVarAndRun(t *testing.T) {
	cfg := newConfig(t, "var", 22)
	p := create(t, cfg)
	out, err := inPod(t, p, `ls -A /var/lib; echo --; ls -A /var/cache; echo --; ls -A /var/log; echo --; ls -A /run; echo --; ls -A /root /home
stat -f -c %T /run; stat -c %a /run/lock; test -s /var/lib/dpkg/status && echo status`)
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	// The /var parts of DefaultSystemDirs this host has (a missing one is
	// left out).
	var lib, cache string
	for _, d := range []string{"/var/lib/apt", "/var/lib/dpkg", "/var/cache/apt", "/var/cache/debconf"} {
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			if strings.HasPrefix(d, "/var/lib/") {
				lib += filepath.Base(d) + "\n"
			} else {
				cache += filepath.Base(d) + "\n"
			}
		}
	}
	want := lib + "--\n" + cache + "--\napt\n--\nlock\n--\n/home:\n\n/root:\ntmpfs\n1777\nstatus\n"
	if out != want {
		t.Errorf("got\n%s\nwant\n%s", out, want)
	}
}

// TestPodEtcMask: /etc and the /var parts are the host's seen through
// the idmap (root inside owns what the host's root owns, so dpkg can
// change it), minus what the host lets nobody but its root read: root
// inside, with every capability of its user namespace (nsenter: no
// seccomp filter), finds no /etc/shadow, /etc/gshadow, /etc/ssl/private
// or debconf's passwords.dat, while /etc/passwd is there, root's.
func TestPodEtcMask(t *testing.T) {
	var secrets []string
	for _, f := range []string{"/etc/shadow", "/etc/gshadow", "/etc/ssl/private", "/var/cache/debconf/passwords.dat"} {
		fi, err := os.Lstat(f)
		if err != nil || fi.Mode().Perm()&0o004 != 0 {
			continue // not on this host, or readable by all anyway
		}
		secrets = append(secrets, f)
	}
	if len(secrets) == 0 {
		testcap.Skip(t, "/etc/shadow", "the mask test hides the host's usual secrets, and none is here")
	}
	cfg := newConfig(t, "mask", 23)
	p := create(t, cfg)
	script := "stat -c '%U %a' /etc/passwd; stat -c %U /etc\n"
	want := "root 644\nroot\n"
	for _, f := range secrets {
		script += fmt.Sprintf("ls -d %s 2>&1 | sed 's/.*No such file.*/absent/'; cat %[1]s >/dev/null 2>&1; echo $?\n", f)
		want += "absent\n1\n"
	}
	if out, err := inPod(t, p, script); out != want {
		t.Errorf("got\n%s(%v)\nwant\n%s", out, err, want)
	}
}
