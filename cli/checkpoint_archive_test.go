package cli

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentrunner/runner/internal/testcap"
	"github.com/agentrunner/runner/wire"
)

// checkpointRunnerd starts a runnerd of the test's own with cgroups (so
// the freezer, so checkpoints) under a cgroup root of its own, removed
// after it.
func checkpointRunnerd(t *testing.T) *daemon {
	t.Helper()
	if os.Geteuid() != 0 {
		testcap.Skip(t, "root", "checkpoints need cgroups, which need root")
	}
	root := fmt.Sprintf("runner-cli-test-%d", os.Getpid())
	d, err := startDaemonArgs(filepath.Join(binDir, "runnerd"), t.TempDir(),
		"--netpolicy", "off", "--cgroups", "auto", "--cgroup-root", root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.stop()
		removeCgroupRoot(t, root)
	})
	if out := d.ok(t, "caps", "--json"); !strings.Contains(out, wire.CapCheckpoint) {
		testcap.Skip(t, "cgroups", fmt.Sprintf("runnerd with --cgroups auto as root does not advertise %s: %s", wire.CapCheckpoint, out))
	}
	return d
}

// removeCgroupRoot removes cgroup root (relative to this process's
// cgroup) in every hierarchy, once runnerd removed its sandboxes' under it.
func removeCgroupRoot(t *testing.T, root string) {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", parts[2], root))
		if parts[1] == "" {
			dirs, _ = filepath.Glob(filepath.Join("/sys/fs/cgroup", parts[2], root))
		}
		for _, d := range dirs {
			if err := os.Remove(d); err != nil && !os.IsNotExist(err) {
				t.Logf("remove test cgroup root %s: %v", d, err)
			}
		}
	}
}

// TestCheckpointExportImportPipe: runner checkpoint export piped into
// runner checkpoint import (two runner processes, one OS pipe) moves a
// checkpoint to another sandbox, which then restores the same bytes; the
// same archive again prints the same id; a cut archive fails
// restore_failed (its exit code) with nothing listed; export without an
// id is a usage error (exit 2).
func TestCheckpointExportImportPipe(t *testing.T) {
	d := checkpointRunnerd(t)
	d.sandbox(t, "ck-from")
	d.sandbox(t, "ck-to")
	d.ok(t, "exec", "ck-from", "--", "sh", "-c", "printf 'a\\000b' > f; mkdir d; echo x > d/y; ln -s d/y l; chmod 0640 f")
	id := strings.TrimSpace(d.ok(t, "checkpoint", "ck-from", "-m", "moving"))

	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	exp := exec.Command(filepath.Join(binDir, "runner"), "checkpoint", "export", "ck-from", id)
	imp := exec.Command(filepath.Join(binDir, "runner"), "checkpoint", "import", "ck-to")
	exp.Env, imp.Env = d.env(), d.env()
	var expErr, impOut, impErr strings.Builder
	exp.Stdout, exp.Stderr = pw, &expErr
	imp.Stdin, imp.Stdout, imp.Stderr = pr, &impOut, &impErr
	if err := exp.Start(); err != nil {
		t.Fatal(err)
	}
	if err := imp.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	pr.Close()
	if err := exp.Wait(); err != nil {
		t.Fatalf("runner checkpoint export: %v, stderr %q", err, expErr.String())
	}
	if err := imp.Wait(); err != nil {
		t.Fatalf("runner checkpoint import: %v, stderr %q", err, impErr.String())
	}
	if got := strings.TrimSpace(impOut.String()); got != id {
		t.Fatalf("runner checkpoint import printed %q, want the exported id %s", got, id)
	}
	d.ok(t, "restore", "ck-to", id)
	want := "a\x00b\nx\nx\n-rw-r-----\n"
	script := "cat f; echo; cat d/y; cat l; stat -c %A f"
	if got := d.ok(t, "exec", "ck-to", "--", "sh", "-c", script); got != want {
		t.Errorf("ck-to after restore: %q, want %q", got, want)
	}

	// The archive through a file: again is the same id (nothing changed).
	arc := filepath.Join(t.TempDir(), "arc")
	o, e, code := d.cli(t, nil, "checkpoint", "export", "ck-from", id)
	if code != 0 {
		t.Fatalf("export: exit %d, stderr %q", code, e)
	}
	if err := os.WriteFile(arc, []byte(o), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, e, code := d.cli(t, []byte(o), "checkpoint", "import", "ck-to", "--json"); code != 0 || decode[wire.Checkpoint](t, out).ID != id {
		t.Errorf("import again: exit %d, stdout %q, stderr %q; want 0 and %s", code, out, e, id)
	}
	d.sandbox(t, "ck-cut")
	out, e, code := d.cli(t, []byte(o[:len(o)/2]), "checkpoint", "import", "ck-cut")
	if code != wire.RunnerExitOther || out != "" || !strings.Contains(e, "restore_failed") {
		t.Errorf("import of a cut archive: exit %d, stdout %q, stderr %q; want %d, nothing, restore_failed", code, out, e, wire.RunnerExitOther)
	}
	if list := d.ok(t, "checkpoints", "ck-cut"); strings.Contains(list, id) {
		t.Errorf("a refused import is listed:\n%s", list)
	}
	if _, e, code := d.cli(t, nil, "checkpoint", "export", "ck-from"); code != 2 {
		t.Errorf("checkpoint export NAME without ID: exit %d, stderr %q; want 2", code, e)
	}
}
