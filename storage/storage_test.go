package storage

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/internal/testcap"
	"golang.org/x/sys/unix"
)

const mib = 1 << 20

// needDriver skips (loudly; fails under CI=true) where the host cannot
// run driver's tests: not root, no loop devices, no tools.
func needDriver(t *testing.T, driver string) {
	t.Helper()
	if os.Geteuid() != 0 {
		testcap.Skip(t, "root", "the storage pool mounts file systems on loop devices")
	}
	if driver == Dir {
		return
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		testcap.Skip(t, "loop", "no /dev/loop-control: "+err.Error())
	}
	tools := map[string][]string{Btrfs: {"mkfs.btrfs", "btrfs"}, Ext4: {"mkfs.ext4", "resize2fs"}}[driver]
	for _, tool := range tools {
		if !haveTool(tool) {
			testcap.Skip(t, tool, fmt.Sprintf("the %s driver runs %s (.ci/run installs it)", driver, tool))
		}
	}
	if !kernelHas(driver) {
		testcap.Absent(t, driver, "not in /proc/filesystems nor a module")
	}
}

// openPool opens a pool of driver in its own temporary directory and
// destroys it when the test ends, then checks that no loop device is
// left on a file of it.
func openPool(t *testing.T, driver string, size int64) *Pool {
	t.Helper()
	needDriver(t, driver)
	dir := filepath.Join(t.TempDir(), "pool")
	p, err := Open(context.Background(), Config{Dir: dir, Driver: driver, Size: size})
	if err != nil {
		t.Fatalf("Open %s: %v", driver, err)
	}
	t.Cleanup(func() {
		if err := p.Destroy(context.Background()); err != nil && !errors.Is(err, ErrClosed) {
			t.Errorf("Destroy: %v", err)
		}
		// A pool closed by the test: open it again to destroy it.
		if _, err := os.Stat(dir); err == nil {
			if q, err := Open(context.Background(), Config{Dir: dir, Driver: driver, Size: size}); err != nil {
				t.Errorf("reopen to destroy: %v", err)
			} else if err := q.Destroy(context.Background()); err != nil {
				t.Errorf("Destroy: %v", err)
			}
		}
		// Whatever failed above, leave nothing mounted on the host.
		for _, pt := range []string{filepath.Join(dir, "mnt")} {
			unmount(pt)
		}
		if vols, err := filepath.Glob(filepath.Join(dir, "volumes", "*")); err == nil {
			for _, pt := range vols {
				unmount(pt)
			}
		}
		// The pool's own bind of its directory, if Destroy did not run.
		unsharePoolDir(dir)
		if l := loopsSettle(t, filepath.Dir(dir), 0); len(l) > 0 {
			t.Errorf("loop devices left on the pool's files: %v", l)
		}
	})
	return p
}

// loopsUnder lists the loop devices whose backing file is under dir.
func loopsUnder(t *testing.T, dir string) []string {
	t.Helper()
	var found []string
	devs, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range devs {
		b, err := os.ReadFile(f)
		if err == nil && strings.HasPrefix(string(b), dir+"/") {
			found = append(found, strings.Split(f, "/")[3]+" → "+strings.TrimSpace(string(b)))
		}
	}
	return found
}

// loopsSettle returns loopsUnder(dir) once it has want devices, or
// after 2 s: autoclear frees a device when its file system goes, which
// a lazy unmount lets happen a moment later.
func loopsSettle(t *testing.T, dir string, want int) []string {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		found := loopsUnder(t, dir)
		if len(found) == want || time.Now().After(deadline) {
			return found
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// fill writes max bytes (in 1 MiB writes, then fsync) to file, and
// returns how many were written and the error that stopped it.
func fill(file string, max int64) (int64, error) {
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	buf := make([]byte, mib)
	for i := range buf {
		buf[i] = byte(i*7 + 1) // not zeros: nothing may compress or skip them
	}
	var n int64
	for n < max {
		k, err := f.Write(buf[:min(int64(len(buf)), max-n)])
		n += int64(k)
		if err != nil {
			return n, err
		}
	}
	return n, f.Sync()
}

func isBudgetErr(err error) bool {
	return errors.Is(err, unix.EDQUOT) || errors.Is(err, unix.ENOSPC)
}

var budgetDrivers = []string{Btrfs, Ext4}

// TestBudgetHolds: writing past a volume's byte limit fails with EDQUOT
// or ENOSPC, in bounds, while another volume of the pool still writes;
// Grow raises the limit, and a shrink is refused.
func TestBudgetHolds(t *testing.T) {
	for _, driver := range budgetDrivers {
		t.Run(driver, func(t *testing.T) {
			ctx := context.Background()
			p := openPool(t, driver, 256*mib)
			a, err := p.Create(ctx, "a", Limits{Bytes: 32 * mib})
			if err != nil {
				t.Fatal(err)
			}
			if a.Limits.Bytes != 32*mib || a.Path != p.Path("a") {
				t.Fatalf("Create: got %+v, want 32 MiB held at %s", a, p.Path("a"))
			}
			if _, err := p.Create(ctx, "b", Limits{Bytes: 32 * mib}); err != nil {
				t.Fatal(err)
			}
			n, err := fill(filepath.Join(a.Path, "f"), 64*mib)
			if !isBudgetErr(err) {
				t.Fatalf("write 64 MiB into a 32 MiB volume: %d bytes, err %v; want EDQUOT or ENOSPC", n, err)
			}
			// ext4's own structures (journal, inode tables) take some of
			// the image; btrfs counts metadata against the qgroup.
			if n > 32*mib || n < 20*mib {
				t.Errorf("written before the budget stopped it: %d bytes, want 20-32 MiB", n)
			}
			t.Logf("%s: %d MiB written into a 32 MiB volume, then %v", driver, n/mib, err)
			if n, err := fill(filepath.Join(p.Path("b"), "f"), 8*mib); err != nil {
				t.Errorf("write 8 MiB into the other volume: %d bytes, %v", n, err)
			}
			if _, err := p.Grow(ctx, "a", Limits{Bytes: 16 * mib}); !errors.Is(err, ErrInvalid) {
				t.Errorf("Grow to a smaller limit: got %v, want ErrInvalid", err)
			}
			g, err := p.Grow(ctx, "a", Limits{Bytes: 96 * mib})
			if driver == Ext4 && !haveCap(unix.CAP_SYS_RESOURCE) {
				if !errors.Is(err, ErrNotSupported) {
					t.Fatalf("ext4 Grow without CAP_SYS_RESOURCE: got %+v, %v; want ErrNotSupported", g, err)
				}
				if n, err := fill(filepath.Join(a.Path, "g"), mib); !isBudgetErr(err) {
					t.Errorf("write after a refused Grow: %d bytes, %v; want the old budget", n, err)
				}
				// Refusing is the behaviour to hold where runnerd lacks the
				// capability (this machine kind's CI VM does): asserted above,
				// and said loudly, since the growth itself is not exercised.
				t.Logf("LOUD: no CAP_SYS_RESOURCE: ext4 Grow refused ErrNotSupported as it must; the online growth itself was not exercised here")
				return
			}
			if err != nil || g.Limits.Bytes != 96*mib {
				t.Fatalf("Grow to 96 MiB: %+v, %v", g, err)
			}
			if n, err := fill(filepath.Join(a.Path, "g"), 40*mib); err != nil {
				t.Errorf("write 40 MiB more after Grow: %d bytes, %v", n, err)
			}
			_, err = p.Grow(ctx, "a", Limits{})
			switch {
			case driver == Btrfs && err != nil:
				t.Errorf("btrfs Grow to no limit: %v", err)
			case driver == Ext4 && !errors.Is(err, ErrInvalid):
				t.Errorf("ext4 Grow to no limit: got %v, want ErrInvalid", err)
			}
		})
	}
}
