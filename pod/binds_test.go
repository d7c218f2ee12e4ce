package pod

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// bindSources makes the host side of an operator's binds: a directory
// and a file anybody may write (so that only the bind's read-only flag
// stops a write from the pod), a directory for a writable bind, and a
// resolver file reached through a symlink (as the host's
// /etc/resolv.conf often is).
type bindSources struct {
	roDir, roFile, rwDir, resolv string
}

func newBindSources(t *testing.T) bindSources {
	t.Helper()
	d := t.TempDir()
	s := bindSources{roDir: filepath.Join(d, "ro"), roFile: filepath.Join(d, "operator.conf"), rwDir: filepath.Join(d, "rw"),
		resolv: filepath.Join(d, "resolv.link")}
	for _, dir := range []string{s.roDir, s.rwDir} {
		if err := os.Mkdir(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		os.Chmod(dir, 0o777)
	}
	for f, body := range map[string]string{filepath.Join(s.roDir, "f"): "data\n", s.roFile: "setting=1\n",
		filepath.Join(d, "resolv.conf"): "nameserver 192.0.2.53\n"} {
		if err := os.WriteFile(f, []byte(body), 0o666); err != nil {
			t.Fatal(err)
		}
		os.Chmod(f, 0o666)
	}
	if err := os.Symlink("resolv.conf", s.resolv); err != nil {
		t.Fatal(err)
	}
	return s
}

// threadMountsMentioning returns the lines of every thread's mount table
// (a thread may have a mount namespace of its own) that name dir.
func threadMountsMentioning(t *testing.T, dir string) []string {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, task := range tasks {
		b, err := os.ReadFile("/proc/self/task/" + task.Name() + "/mountinfo")
		if err != nil {
			continue // the thread ended
		}
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, dir) {
				out = append(out, task.Name()+": "+l)
			}
		}
	}
	return out
}

func (s bindSources) apply(cfg *Config) {
	cfg.Binds = []Bind{{Source: s.roDir, Target: "/opt/data"}, {Source: s.roFile, Target: "/etc/operator.conf"},
		{Source: s.rwDir, Target: "/mnt/rw", Writable: true}}
	cfg.ResolvConf = s.resolv
}

// TestPodBinds: an operator's binds and the resolver file are in the
// pod; a read-only one refuses every write from root inside (with every
// capability of its user namespace, and no seccomp filter: nsenter)
// with EROFS, though the host's files are writable by anybody, and
// cannot be remounted read-write (the kernel locked the flag: EPERM); a writable one takes writes, which land on
// the host with the block's ids. Nothing of them stays mounted on the
// host, and the sources are as they were.
func TestPodBinds(t *testing.T) {
	s := newBindSources(t)
	cfg := newConfig(t, "binds", 24)
	s.apply(&cfg)
	p := create(t, cfg)
	// The staging namespace the holder was forked from is gone: no
	// thread of this process (the forking one went back) holds the
	// sources mounted.
	for _, src := range []string{s.roDir, s.roFile, s.rwDir} {
		if m := threadMountsMentioning(t, src); len(m) != 0 {
			t.Errorf("a thread's mount table names %s while the pod runs: %q", src, m)
		}
	}
	out, err := inPod(t, p, `cat /opt/data/f /etc/operator.conf /etc/resolv.conf
for m in /opt/data /etc/operator.conf /etc/resolv.conf; do mount -o remount,bind,rw $m 2>/dev/null; echo remount $?; done
echo x > /opt/data/f; echo x > /opt/data/new; echo x > /etc/operator.conf; echo x > /etc/resolv.conf; rm -f /opt/data/f
echo written > /mnt/rw/new && cat /mnt/rw/new
grep -c binds /etc/hosts`)
	want := "data\nsetting=1\nnameserver 192.0.2.53\nremount 32\nremount 32\nremount 32\n" +
		"/bin/sh: 3: cannot create /opt/data/f: Read-only file system\n" +
		"/bin/sh: 3: cannot create /opt/data/new: Read-only file system\n" +
		"/bin/sh: 3: cannot create /etc/operator.conf: Read-only file system\n" +
		"/bin/sh: 3: cannot create /etc/resolv.conf: Read-only file system\n" +
		"rm: cannot remove '/opt/data/f': Read-only file system\n" +
		"written\n1\n"
	if out != want {
		t.Errorf("got\n%s(%v)\nwant\n%s", out, err, want)
	}
	for f, body := range map[string]string{filepath.Join(s.roDir, "f"): "data\n", s.roFile: "setting=1\n"} {
		if b, err := os.ReadFile(f); string(b) != body {
			t.Errorf("the host's %s: %q (%v), want %q", f, b, err, body)
		}
	}
	if _, err := os.Lstat(filepath.Join(s.roDir, "new")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the read-only source got a new file: %v", err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(s.rwDir, "new"), &st); err != nil || st.Uid != cfg.UIDBase {
		t.Errorf("the writable bind's new file on the host: uid %d (%v), want %d", st.Uid, err, cfg.UIDBase)
	}
	if err := p.Destroy(ctxT(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	for _, src := range []string{s.roDir, s.roFile, s.rwDir} {
		if m := mountsMentioning(t, src); len(m) != 0 {
			t.Errorf("the host's mount table names %s: %q", src, m)
		}
	}
}

// TestPodBindPlantedLink: a symlink root inside left in its upper layer
// where a file bind's mount point is (here: pointing at the pod's
// /etc/passwd) is replaced, inside the pod's own tree, by the mount
// point: the next pod shows the bind's source there and the link's
// target is unchanged.
func TestPodBindPlantedLink(t *testing.T) {
	s := newBindSources(t)
	cfg := newConfig(t, "plant", 25)
	p := create(t, cfg)
	if out, err := inPod(t, p, "ln -s /etc/passwd /etc/operator.conf && ln -s /etc /opt/data"); err != nil {
		t.Fatalf("plant: %v %s", err, out)
	}
	if err := p.Destroy(ctxT(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	cfg.Binds = []Bind{{Source: s.roFile, Target: "/etc/operator.conf"}}
	p = create(t, cfg)
	if out, err := inPod(t, p, "cat /etc/operator.conf; test -L /etc/operator.conf || echo not a link; grep -c ^root: /etc/passwd"); out != "setting=1\nnot a link\n1\n" {
		t.Errorf("got %q (%v), want the bind's source, not the link's target", out, err)
	}
	if err := p.Destroy(ctxT(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	// A directory's mount point is never made through a link: that pod
	// does not start (the sandbox can break only its own pod).
	cfg.Binds = []Bind{{Source: s.roDir, Target: "/opt/data/x"}}
	if p, err := Create(ctxT(t, 30*time.Second), cfg); err == nil {
		p.Destroy(ctxT(t, 30*time.Second))
		t.Errorf("Create with a bind below a planted link: started, want refused")
	}
	if _, err := os.Lstat("/etc/x"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the host's /etc/x: %v, want absent", err)
	}
}

// TestPodBindInvalid: binds Create cannot hold are ErrInvalid and start
// nothing; a source that is a symlink (the last element is never
// followed) or not a file or directory is refused.
func TestPodBindInvalid(t *testing.T) {
	s := newBindSources(t)
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(s.roDir, link); err != nil {
		t.Fatal(err)
	}
	good := newConfig(t, "bindinv", 26)
	for _, tc := range []struct {
		name    string
		binds   []Bind
		resolv  string
		invalid bool
	}{
		{"relative target", []Bind{{Source: s.roDir, Target: "opt/x"}}, "", true},
		{"dot-dot target", []Bind{{Source: s.roDir, Target: "/opt/../etc"}}, "", true},
		{"root target", []Bind{{Source: s.roDir, Target: "/"}}, "", true},
		{"over /proc", []Bind{{Source: s.roDir, Target: "/proc/sys"}}, "", true},
		{"over /dev", []Bind{{Source: s.roDir, Target: "/dev"}}, "", true},
		{"in the workspace", []Bind{{Source: s.roDir, Target: "/workspace/x"}}, "", true},
		{"in /tmp", []Bind{{Source: s.roDir, Target: "/tmp/x"}}, "", true},
		{"nested targets", []Bind{{Source: s.roDir, Target: "/opt/a"}, {Source: s.rwDir, Target: "/opt/a/b"}}, "", true},
		{"over resolv.conf", []Bind{{Source: s.roFile, Target: "/etc/resolv.conf"}}, s.resolv, true},
		{"relative source", []Bind{{Source: "ro", Target: "/opt/x"}}, "", true},
		{"relative resolv.conf", nil, "resolv.conf", true},
		{"a device", []Bind{{Source: "/dev/null", Target: "/opt/x"}}, "", true},
		{"a symlink source", []Bind{{Source: link, Target: "/opt/x"}}, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := good
			c.Binds, c.ResolvConf = tc.binds, tc.resolv
			p, err := Create(ctxT(t, 10*time.Second), c)
			if p != nil {
				p.Destroy(ctxT(t, 10*time.Second))
			}
			if err == nil || tc.invalid && !errors.Is(err, ErrInvalid) {
				t.Errorf("got %v, want an error (ErrInvalid: %v)", err, tc.invalid)
			}
		})
	}
}
