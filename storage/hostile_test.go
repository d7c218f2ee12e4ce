package storage

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// buildProbe builds the seccomp package's probe (it loads the real
// sandbox filter, seccomp.Default, as the shim's helper does) into a
// directory of the test.
func buildProbe(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "probe")
	out, err := exec.Command("go", "build", "-o", bin, "../seccomp/testdata/probe").CombinedOutput()
	if err != nil {
		t.Fatalf("go build probe: %v: %s", err, out)
	}
	return bin
}

// probeLines runs the probe in dir (its cwd: the unprivileged user
// cannot walk the test's 0700 directories to it) and parses its
// "name number..." lines.
func probeLines(t *testing.T, probe, dir string, args ...string) map[string][]int64 {
	t.Helper()
	cmd := exec.Command(probe, args...)
	cmd.Dir = dir
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("probe %v: %v: %s", args, err, errb.String())
	}
	m := map[string][]int64{}
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		f := strings.Fields(l)
		for _, s := range f[1:] {
			n, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				t.Fatalf("probe line %q", l)
			}
			m[f[0]] = append(m[f[0]], n)
		}
	}
	return m
}

const attacker = 12345 // an unprivileged uid, as a sandbox's command runs

// TestNestedSubvolumeEscape is the attack on the btrfs driver's budget:
// an unprivileged command in a volume limited to 20 MiB creates a
// nested subvolume (which needs only write access; it gets a quota
// group of its own, with no limit) and writes 60 MiB into it. Without
// the sandbox's seccomp filter the budget is escaped; under it the
// create is refused with EPERM and the writes stop at the budget with
// EDQUOT.
func TestNestedSubvolumeEscape(t *testing.T) {
	ctx := context.Background()
	p := openPool(t, Btrfs, 256*mib)
	probe := buildProbe(t)
	const budget, attempt = 20 * mib, 60 * mib
	volume := func(name string) string {
		t.Helper()
		v, err := p.Create(ctx, name, Limits{Bytes: budget})
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(v.Path, attacker, attacker); err != nil {
			t.Fatal(err)
		}
		return v.Path
	}
	uid := strconv.Itoa(attacker)
	size := strconv.Itoa(attempt)

	// The hole, shown first: without the filter the attack works, so
	// the run under it below proves the filter is what stops it.
	bare := probeLines(t, probe, volume("bare"), "-uid", uid, "btrfs-escape", ".", size)
	if got := bare["subvol_create"]; len(got) != 1 || got[0] != 0 {
		t.Fatalf("unfiltered nested subvolume create: errno %v, want 0 (the hole this test guards is not reproduced)", got)
	}
	if got := bare["written"]; len(got) != 2 || got[0] <= budget {
		t.Fatalf("unfiltered write into the nested subvolume: %v, want more than the %d-byte budget", got, budget)
	}
	t.Logf("without the filter: nested subvolume made, %d MiB written past a %d MiB budget", bare["written"][0]/mib, budget/mib)

	filtered := probeLines(t, probe, volume("filtered"), "-uid", uid, "-filter", "btrfs-escape", ".", size)
	if got := filtered["subvol_create"]; len(got) != 1 || unix.Errno(got[0]) != unix.EPERM {
		t.Errorf("nested subvolume create under the filter: errno %v, want EPERM (%d)", got, int(unix.EPERM))
	}
	got := filtered["written"]
	if len(got) != 2 || got[0] > budget || (unix.Errno(got[1]) != unix.EDQUOT && unix.Errno(got[1]) != unix.ENOSPC) {
		t.Fatalf("write under the filter: %v (bytes, errno); want at most %d bytes, then EDQUOT or ENOSPC", got, budget)
	}
	u, err := p.Usage(ctx, "filtered")
	if err != nil {
		t.Fatal(err)
	}
	if u.Bytes > budget {
		t.Errorf("usage of the attacked volume: %d bytes, over its %d-byte budget", u.Bytes, budget)
	}
	// Delete finds and removes the nested subvolume the unfiltered run
	// made (by id), and frees the escaped space.
	if err := p.Delete(ctx, "bare"); err != nil {
		t.Errorf("Delete the volume holding a nested subvolume: %v", err)
	}
}

// TestBtrfsIoctlsAsRoot tries each subvolume and snapshot ioctl as root
// (the strongest caller: for the destroy calls the kernel itself stops
// an unprivileged one), once without the filter, where the kernel makes
// and destroys the subvolumes, and once under it, where each gets EPERM.
func TestBtrfsIoctlsAsRoot(t *testing.T) {
	ctx := context.Background()
	p := openPool(t, Btrfs, 256*mib)
	probe := buildProbe(t)
	names := []string{"subvol_create", "subvol_create_v2", "snap_create", "snap_create_v2", "snap_destroy", "snap_destroy_v2", "subvol_create_high_bits"}
	for _, tc := range []struct {
		name   string
		args   []string
		errnos func(string) unix.Errno
	}{
		{"unfiltered", []string{"btrfs-ioctls", "."}, func(string) unix.Errno { return 0 }},
		{"filtered", []string{"-filter", "btrfs-ioctls", "."}, func(string) unix.Errno { return unix.EPERM }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := p.Create(ctx, tc.name, Limits{Bytes: 32 * mib})
			if err != nil {
				t.Fatal(err)
			}
			got := probeLines(t, probe, v.Path, tc.args...)
			if len(got) != len(names) {
				t.Fatalf("probe answered %v, want %d calls", got, len(names))
			}
			for _, n := range names {
				if e := got[n]; len(e) != 1 || unix.Errno(e[0]) != tc.errnos(n) {
					t.Errorf("%s %s: errno %v, want %d (%v)", tc.name, n, e, int(tc.errnos(n)), tc.errnos(n))
				}
			}
			if err := p.Delete(ctx, tc.name); err != nil {
				t.Errorf("Delete: %v", err)
			}
		})
	}
}

// TestDeleteIgnoresSubvolumeNames: Delete finds nested subvolumes by
// their ids in the root tree, not by parsing `btrfs subvolume list`,
// which prints names raw. A command not under the filter names a
// nested subvolume so that its name adds a line claiming another
// volume is nested in its own; deleting its volume must leave the other
// one whole.
func TestDeleteIgnoresSubvolumeNames(t *testing.T) {
	ctx := context.Background()
	p := openPool(t, Btrfs, 256*mib)
	victim, err := p.Create(ctx, "victim", Limits{Bytes: 16 * mib})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(victim.Path, "data"), []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	evil, err := p.Create(ctx, "evil", Limits{Bytes: 16 * mib})
	if err != nil {
		t.Fatal(err)
	}
	id := func(path string) string {
		t.Helper()
		out, err := run(ctx, "btrfs", "inspect-internal", "rootid", path)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(out)
	}
	name := "x\nID " + id(victim.Path) + " gen 1 top level " + id(evil.Path) + " path y"
	if _, err := run(ctx, "btrfs", "subvolume", "create", filepath.Join(evil.Path, name)); err != nil {
		t.Fatal(err)
	}
	if err := p.Delete(ctx, "evil"); err != nil {
		t.Errorf("Delete of the volume with the crafted name: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(victim.Path, "data")); err != nil || string(b) != "mine" {
		t.Errorf("the other volume after Delete: %q, %v; want it whole", b, err)
	}
	if _, err := p.Usage(ctx, "victim"); err != nil {
		t.Errorf("Usage of the other volume: %v", err)
	}
}
