package pod

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// copyFile copies the host file src to the same path under root.
func copyFile(t *testing.T, root, src string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(root, src)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

// TestRootfs: with an operator-named root file system the pod's root is
// that tree (and the pod's mount points), nothing of the host's; root
// inside writes to it through the upper layer, owned by the block's
// root, and the tree itself is not changed.
func TestRootfs(t *testing.T) {
	cfg := newConfig(t, "rootfs", 14)
	rootfs := t.TempDir()
	// A shell and what it links: dash, the C library, the loader.
	sh, err := filepath.EvalSymlinks("/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{sh, "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"} {
		if _, err := os.Stat(f); err != nil {
			t.Skipf("not a Debian amd64 layout (%v): the test builds its rootfs from the host's dash", err)
		}
		real, _ := filepath.EvalSymlinks(f)
		copyFile(t, rootfs, real)
		if real != f {
			if err := os.MkdirAll(filepath.Dir(filepath.Join(rootfs, f)), 0o755); err != nil {
				t.Fatal(err)
			}
			os.Symlink(real, filepath.Join(rootfs, f))
		}
	}
	if err := os.Symlink(sh, filepath.Join(rootfs, "sh")); err != nil {
		t.Fatal(err)
	}
	cfg.Rootfs = rootfs
	p := create(t, cfg)
	cmd := []string{"nsenter", "-t", "", "-U", "-m", "-p", "-i", "-u", "-S", "0", "-G", "0", "--wdns=/", "/sh", "-c", "echo /*; echo made > /made; read x < /made; echo $x"}
	out, err := inPodArgv(t, p, cmd)
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	want := "/dev /lib /lib64 /proc /run /sh /tmp /usr /var /workspace\nmade\n"
	if out != want {
		t.Errorf("got %q, want %q (the rootfs's tree and the pod's mount points only)", out, want)
	}
	if _, err := os.Lstat(filepath.Join(rootfs, "made")); !os.IsNotExist(err) {
		t.Errorf("the rootfs itself: /made %v, want absent", err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(cfg.Upper, "root", "upper", "made"), &st); err != nil || st.Uid != cfg.UIDBase {
		t.Errorf("the upper layer's /made: uid %d (%v), want %d", st.Uid, err, cfg.UIDBase)
	}
}
