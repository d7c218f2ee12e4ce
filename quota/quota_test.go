package quota_test

import (
	"compress/gzip"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/agentrunner/runner/internal/testcap"
	"github.com/agentrunner/runner/quota"
)

// projectFS makes a file system with project quotas in an image in
// t.TempDir(), loop-mounts it with prjquota (or without, when on is
// false) and unmounts it in Cleanup: ext4 made with -O quota,project, or
// xfs where the kernel's ext4 has no quota support (CONFIG_QUOTA off; xfs
// has quotas of its own).
func projectFS(t *testing.T, on bool) string {
	t.Helper()
	if os.Geteuid() != 0 {
		testcap.Skip(t, "root", "loop-mounts a file system image with project quotas")
	}
	dir := t.TempDir()
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	var tried []string
	for _, fs := range []struct {
		mkfs []string
		size int64
	}{
		{[]string{"mkfs.ext4", "-q", "-F", "-O", "quota,project"}, 64 << 20},
		{[]string{"mkfs.xfs", "-q", "-f"}, 320 << 20}, // xfs's smallest
	} {
		if _, err := exec.LookPath(fs.mkfs[0]); err != nil {
			tried = append(tried, err.Error())
			continue
		}
		img := filepath.Join(dir, fs.mkfs[0]+".img")
		f, err := os.Create(img)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(fs.size); err != nil {
			t.Fatal(err)
		}
		f.Close()
		if out, err := exec.Command(fs.mkfs[0], append(fs.mkfs[1:], img)...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", fs.mkfs[0], err, out)
		}
		opts := "loop"
		if on {
			opts += ",prjquota"
		}
		out, err := exec.Command("mount", "-o", opts, img, mnt).CombinedOutput()
		if err != nil {
			tried = append(tried, fs.mkfs[0]+": mount -o "+opts+": "+strings.TrimSpace(string(out)))
			continue
		}
		t.Cleanup(func() {
			if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
				t.Errorf("umount %s: %v: %s (detaching it)", mnt, err, out)
				exec.Command("umount", "-l", mnt).Run()
			}
		})
		t.Logf("project quotas on %s", fs.mkfs[0])
		return mnt
	}
	if lacks := kernelLacksProjectQuotas(); lacks != "" {
		testcap.Absent(t, lacks, strings.Join(tried, "; "))
	}
	testcap.Skip(t, "project quotas", strings.Join(tried, "; "))
	return ""
}

// writeAs runs dd as uid/gid 65534 (no capabilities) writing n KiB into
// path, and returns its error and output.
func writeAs(path string, kib int) (string, error) {
	cmd := exec.Command("dd", "if=/dev/zero", "of="+path, "bs=1024", "count="+itoa(kib))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func itoa(n int) string {
	b := []byte{}
	for {
		b = append([]byte{byte('0' + n%10)}, b...)
		if n /= 10; n == 0 {
			return string(b)
		}
	}
}

// TestProjectBudget: a directory given a project and a 1 MiB, 50-inode
// limit refuses an unprivileged writer past them (EDQUOT, "Disk quota
// exceeded"), a sibling directory without the limit is untouched, the
// kernel's limit reads back, and usage counts what was written.
func TestProjectBudget(t *testing.T) {
	mnt := projectFS(t, true)
	if err := quota.Supported(mnt); err != nil {
		t.Fatalf("Supported on a prjquota mount: %v", err)
	}
	box, other := filepath.Join(mnt, "box"), filepath.Join(mnt, "other")
	for _, d := range []string{box, other} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(d, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	if err := quota.SetProject(box, 1001); err != nil {
		t.Fatal(err)
	}
	want := quota.Limit{Bytes: 1 << 20, Inodes: 50}
	if err := quota.SetLimit(box, 1001, want); err != nil {
		t.Fatal(err)
	}
	if got, _, err := quota.Get(mnt, 1001); err != nil || got != want {
		t.Fatalf("limit read back: got %+v %v, want %+v", got, err, want)
	}
	// A subdirectory made later inherits the project.
	sub := filepath.Join(box, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chown(sub, 65534, 65534)
	out, err := writeAs(filepath.Join(sub, "big"), 2048)
	if err == nil || !strings.Contains(out, "Disk quota exceeded") {
		t.Fatalf("2 MiB into a 1 MiB budget: err %v, output %q, want Disk quota exceeded", err, out)
	}
	if _, u, err := quota.Get(mnt, 1001); err != nil || u.Bytes > 1<<20 || u.Bytes < 900<<10 || u.Inodes < 2 {
		t.Fatalf("usage: got %+v %v, want about 1 MiB and the files", u, err)
	}
	if out, err := writeAs(filepath.Join(other, "big"), 2048); err != nil {
		t.Fatalf("2 MiB outside the budget: %v: %s", err, out)
	}
	// Inodes: the 50th file past the files there is refused.
	var ierr error
	for i := range 60 {
		cmd := exec.Command("touch", filepath.Join(box, "f"+itoa(i)))
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		if out, err := cmd.CombinedOutput(); err != nil {
			ierr = errors.New(string(out))
			break
		}
	}
	if ierr == nil || !strings.Contains(ierr.Error(), "Disk quota exceeded") {
		t.Fatalf("60 files into a 50-inode budget: got %v, want Disk quota exceeded", ierr)
	}
}

// TestNotSupported: without prjquota the file system says so, and no
// limit is reported set.
func TestNotSupported(t *testing.T) {
	mnt := projectFS(t, false)
	if err := quota.Supported(mnt); !errors.Is(err, quota.ErrNotSupported) {
		t.Fatalf("Supported without prjquota: got %v, want ErrNotSupported", err)
	}
	if err := quota.SetLimit(mnt, 1001, quota.Limit{Bytes: 1 << 20}); err == nil {
		t.Fatal("SetLimit without prjquota succeeded")
	}
}

// kernelLacksProjectQuotas names the kernel options missing for project
// quotas on ext4 (CONFIG_QFMT_V2) and xfs (CONFIG_XFS_QUOTA), by the
// kernel's own configuration in /proc/config.gz, or says "" where either
// is built or the configuration cannot be read (then a refused mount is
// a missing capability, not the kernel's).
func kernelLacksProjectQuotas() string {
	f, err := os.Open("/proc/config.gz")
	if err != nil {
		return ""
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return ""
	}
	conf, err := io.ReadAll(zr)
	if err != nil {
		return ""
	}
	built := func(opt string) bool {
		for _, line := range strings.Split(string(conf), "\n") {
			if line == opt+"=y" || line == opt+"=m" {
				return true
			}
		}
		return false
	}
	if built("CONFIG_QFMT_V2") || built("CONFIG_XFS_QUOTA") {
		return ""
	}
	return "CONFIG_QFMT_V2 and CONFIG_XFS_QUOTA (per /proc/config.gz)"
}
