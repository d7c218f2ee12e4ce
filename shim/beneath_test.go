package shim

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/shim/internal/proto"
	"github.com/agentrunner/runner/shim/internal/shimtest"
	"github.com/agentrunner/runner/shim/launch"
	"github.com/agentrunner/runner/shim/sessiondir"
	"golang.org/x/sys/unix"
)

// beneathFixture is a workspace (owned by nobody, 0700, under a directory
// only root may pass, as runnerd's) holding a real directory "sub" and
// symlinks a hostile command could plant: out of it (absolute, relative,
// into /root, through a link inside) and one that stays inside; and a
// victim directory beside it with a secret, readable by anyone (so only
// the confinement, not a permission, keeps a command out).
type beneathFixture struct {
	ws, victim string
}

func newBeneathFixture(t *testing.T) beneathFixture {
	t.Helper()
	return newBeneathFixtureAs(t, 65534)
}

// newBeneathFixtureAs is newBeneathFixture with the workspace owned by
// uid (the test's own, for a test that needs no root).
func newBeneathFixtureAs(t *testing.T, uid int) beneathFixture {
	t.Helper()
	closed := t.TempDir()
	if err := os.Chmod(closed, 0o711); err != nil {
		t.Fatal(err)
	}
	f := beneathFixture{ws: filepath.Join(closed, "ws"), victim: filepath.Join(closed, "victim")}
	for _, d := range []string{f.ws, filepath.Join(f.ws, "sub"), filepath.Join(f.ws, "sub", "deeper"), f.victim} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(f.victim, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(f.victim, "secret"), []byte("victim\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{
		"abs":            f.victim,
		"rel":            "../victim",
		"root":           "/root",
		"slash":          "/",
		"sub/up":         "../..",
		"sub/deeper/abs": f.victim,
		"in":             "sub/deeper", // stays inside
		"proc":           "/proc/self/cwd",
	} {
		if err := os.Symlink(target, filepath.Join(f.ws, link)); err != nil {
			t.Fatal(err)
		}
	}
	err := filepath.WalkDir(f.ws, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, uid)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(f.ws, 0o700); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestDirBeneath: with Spec.DirRoot a working directory reached through a
// symlink that leaves the root fails the start (exec phase, EXDEV) and the
// command never runs, on every path a command takes (the direct one as
// root and as a user, the nsexec helper of an Isolate command); a symlink
// that stays inside is followed; the root itself is entered as before.
func TestDirBeneath(t *testing.T) {
	shimtest.NeedRoot(t)
	f := newBeneathFixture(t)
	// The command plants a file only where the test owns the directory, so
	// a broken confinement (as root, in / or /root) shows in its output
	// and the start's result without writing to the host.
	script := fmt.Sprintf(`case $(pwd -P) in %s*) echo pwned > planted;; esac; pwd -P`, f.victim)
	paths := []struct {
		name string
		spec sessiondir.Spec
	}{
		{"direct as root", sessiondir.Spec{}},
		{"direct as nobody", sessiondir.Spec{User: "nobody"}},
		{"helper, isolated", sessiondir.Spec{User: "nobody", Isolate: true}},
	}
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			for _, bad := range []string{"abs", "rel", "root", "slash", "sub/up", "sub/deeper/abs", "in/abs", "abs/x", "proc"} {
				spec := p.spec
				spec.ID, spec.Env, spec.Argv = "t1", shimtest.TestEnv, []string{"sh", "-c", script}
				spec.Dir, spec.DirRoot = filepath.Join(f.ws, bad), f.ws
				_, err := shimtest.ColdStart(shimtest.CtxT(t, 10*time.Second), shimtest.ShimExe, shimtest.SessionDir(t), spec)
				var se *launch.StartError
				if !errors.As(err, &se) || se.Phase != proto.PhaseExec || !errors.Is(err, unix.EXDEV) || !strings.Contains(err.Error(), "resolves outside "+f.ws) {
					t.Errorf("cwd %s: %v, want an exec-phase StartError wrapping EXDEV that says it resolves outside %s", bad, err, f.ws)
				}
			}
			for _, good := range []struct{ dir, want string }{
				{".", f.ws}, {"sub", filepath.Join(f.ws, "sub")}, {"in", filepath.Join(f.ws, "sub", "deeper")},
			} {
				spec := p.spec
				spec.Argv = []string{"sh", "-c", "pwd -P"}
				spec.Dir, spec.DirRoot = filepath.Join(f.ws, good.dir), f.ws
				if out, code := runToEnd(t, spec); code != 0 || out != good.want+"\n" {
					t.Errorf("cwd %s: exit %d output %q, want 0 and %q", good.dir, code, out, good.want+"\n")
				}
			}
		})
	}
	if _, err := os.Stat(filepath.Join(f.victim, "planted")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a command ran in the victim's directory: %v", err)
	}
	if _, err := os.Stat("/root/planted"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a command ran in /root: %v", err)
	}
	// Dir must lie under DirRoot at all: refused before anything starts.
	_, err := shimtest.ColdStart(shimtest.CtxT(t, 10*time.Second), shimtest.ShimExe, shimtest.SessionDir(t), sessiondir.Spec{ID: "t1", Env: shimtest.TestEnv, Argv: []string{"true"}, Dir: f.victim, DirRoot: f.ws})
	if !errors.Is(err, sessiondir.ErrInvalid) {
		t.Errorf("cwd %s outside cwd_root %s: %v, want ErrInvalid", f.victim, f.ws, err)
	}
}

// TestDirBeneathAsUser: the path below the root is resolved as the user
// (in the helper after the user switch, on the direct path by the shim
// with the user's file-system identity), so a directory below the root
// that the user may not pass stops it (EACCES), as its own cd would; the
// root itself need only let it in (the directories above it are root's,
// 0700).
func TestDirBeneathAsUser(t *testing.T) {
	shimtest.NeedRoot(t)
	f := newBeneathFixture(t)
	if err := os.Chmod(filepath.Dir(f.ws), 0o700); err != nil {
		t.Fatal(err)
	}
	locked := filepath.Join(f.ws, "locked")
	if err := os.MkdirAll(filepath.Join(locked, "inner"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(locked, 0o700); err != nil { // root's
		t.Fatal(err)
	}
	spec := sessiondir.Spec{Argv: []string{"sh", "-c", "pwd -P"}, User: "nobody", Isolate: true, Dir: filepath.Join(f.ws, "sub"), DirRoot: f.ws}
	if out, code := runToEnd(t, spec); code != 0 || out != filepath.Join(f.ws, "sub")+"\n" {
		t.Fatalf("cwd sub behind a 0700 parent: exit %d output %q", code, out)
	}
	for _, isolate := range []bool{true, false} { // the helper, the direct path
		spec = sessiondir.Spec{ID: "t1", Env: shimtest.TestEnv, Argv: []string{"true"}, User: "nobody", Isolate: isolate, Dir: filepath.Join(locked, "inner"), DirRoot: f.ws}
		_, err := shimtest.ColdStart(shimtest.CtxT(t, 10*time.Second), shimtest.ShimExe, shimtest.SessionDir(t), spec)
		if !errors.Is(err, unix.EACCES) {
			t.Errorf("isolate %v: cwd below root's 0700 %s as nobody: %v, want EACCES", isolate, locked, err)
		}
	}
}

// TestDirBeneathRace: a command that swaps a directory of its root with a
// symlink out of it, as fast as it can, while commands are started there:
// each starts in the directory or fails with EXDEV, never runs outside.
func TestDirBeneathRace(t *testing.T) {
	shimtest.NeedRoot(t)
	f := newBeneathFixture(t)
	real, flip := filepath.Join(f.ws, "real"), filepath.Join(f.ws, "flip")
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(f.victim, flip); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			unix.Renameat2(unix.AT_FDCWD, real, unix.AT_FDCWD, flip, unix.RENAME_EXCHANGE)
		}
	}()
	defer func() { close(stop); <-done }()
	ran, refused := 0, 0
	for i := range 20 {
		for _, p := range []sessiondir.Spec{{}, {User: "nobody", Isolate: true}} {
			spec := p
			spec.ID, spec.Env = "t1", shimtest.TestEnv
			spec.Argv = []string{"sh", "-c", fmt.Sprintf("echo pwned > planted-%d; pwd -P", i)}
			spec.Dir, spec.DirRoot = flip, f.ws
			dir := shimtest.SessionDir(t)
			_, err := shimtest.ColdStart(shimtest.CtxT(t, 10*time.Second), shimtest.ShimExe, dir, spec)
			switch {
			case err == nil:
				e := shimtest.WaitExit(t, dir)
				out := shimtest.StdoutOf(t, dir)
				if e.Code != 0 || (out != real+"\n" && out != flip+"\n") {
					t.Errorf("started: exit %d output %q, want it in %s or %s", e.Code, out, real, flip)
				}
				ran++
			case errors.Is(err, unix.EXDEV):
				refused++
			default:
				t.Errorf("start: %v, want a start or EXDEV", err)
			}
		}
	}
	t.Logf("%d started inside, %d refused", ran, refused)
	ents, _ := os.ReadDir(f.victim)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "planted") {
			t.Errorf("a command ran in the victim's directory: %s", e.Name())
		}
	}
}

// TestDirBeneathAheadHelper: a warm shim's helper started ahead confines
// the working directory the same way, and its refusal is the start's
// error (exec phase, EXDEV), not a lost report: the helper exits with the
// go byte unread, which resets the connection after its report. (Before,
// the reset won: "nsexec: read the helper's report: ... connection reset
// by peer", a setup failure.)
func TestDirBeneathAheadHelper(t *testing.T) {
	shimtest.NeedRoot(t)
	f := newBeneathFixture(t)
	p := newHelperPool(t, 1)
	for _, bad := range []string{"abs", "sub/up"} {
		shimtest.WaitWarm(t, p, 1)
		spec := sessiondir.Spec{ID: "t1", Env: shimtest.TestEnv, Argv: []string{"true"}, User: "nobody", Isolate: true, Dir: filepath.Join(f.ws, bad), DirRoot: f.ws}
		_, err := p.Start(shimtest.CtxT(t, 10*time.Second), shimtest.PoolDir(t, p), spec)
		var se *launch.StartError
		if !errors.As(err, &se) || se.Phase != proto.PhaseExec || !errors.Is(err, unix.EXDEV) {
			t.Errorf("cwd %s through a helper ahead: %v, want an exec-phase StartError wrapping EXDEV", bad, err)
		}
	}
	dir, _ := shimtest.PoolStart(t, p, sessiondir.Spec{User: "nobody", Isolate: true, Argv: []string{"pwd", "-P"}, Dir: filepath.Join(f.ws, "in"), DirRoot: f.ws})
	if e := shimtest.WaitExit(t, dir); e.Code != 0 || shimtest.StdoutOf(t, dir) != filepath.Join(f.ws, "sub", "deeper")+"\n" {
		t.Errorf("cwd in (a link inside): exit %+v output %q", e, shimtest.StdoutOf(t, dir))
	}
}

// TestBindSourceSymlink: a Spec.Binds source that is a symlink fails the
// start (ELOOP) instead of root mounting wherever it points; the
// command never sees the link's target.
func TestBindSourceSymlink(t *testing.T) {
	shimtest.NeedRoot(t)
	f := newBeneathFixture(t)
	link := filepath.Join(t.TempDir(), "tmp")
	if err := os.Symlink(f.victim, link); err != nil {
		t.Fatal(err)
	}
	spec := sessiondir.Spec{ID: "t1", Env: shimtest.TestEnv, Argv: []string{"cat", "/var/tmp/secret"}, User: "nobody", Isolate: true,
		Binds: []sessiondir.Bind{{Source: link, Target: "/var/tmp"}}}
	dir := shimtest.SessionDir(t)
	_, err := shimtest.ColdStart(shimtest.CtxT(t, 10*time.Second), shimtest.ShimExe, dir, spec)
	var se *launch.StartError
	if !errors.As(err, &se) || !errors.Is(err, unix.ELOOP) {
		out := ""
		if err == nil {
			shimtest.WaitExit(t, dir)
			out = shimtest.StdoutOf(t, dir)
		}
		t.Fatalf("bind of symlink %s -> %s: %v (output %q), want a StartError wrapping ELOOP", link, f.victim, err, out)
	}
}

// TestLookPathAsUser: the shim looks the command up as its user, not as
// root, so a path below a directory the user cannot search answers
// EACCES whether it exists or not (as root's lookup, ENOENT for an absent
// one told the command's caller what lies in root's directories), and a
// command the user can reach is found and runs.
func TestLookPathAsUser(t *testing.T) {
	shimtest.NeedRoot(t)
	closed := t.TempDir() // 0700, root's
	if err := os.WriteFile(filepath.Join(closed, "tool"), []byte("#!/bin/sh\necho tool\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []sessiondir.Spec{{User: "nobody"}, {User: "nobody", Isolate: true}} {
		for _, argv0 := range []string{filepath.Join(closed, "tool"), filepath.Join(closed, "absent")} {
			spec := p
			spec.ID, spec.Env, spec.Argv, spec.Dir = "t1", shimtest.TestEnv, []string{argv0}, "/"
			_, err := shimtest.ColdStart(shimtest.CtxT(t, 10*time.Second), shimtest.ShimExe, shimtest.SessionDir(t), spec)
			var se *launch.StartError
			if !errors.As(err, &se) || se.Phase != proto.PhaseExec || !errors.Is(err, unix.EACCES) {
				t.Errorf("isolate %v: exec %s as nobody: %v, want an exec-phase StartError wrapping EACCES", p.Isolate, argv0, err)
			}
		}
		// PATH lookup as the user: the closed directory is skipped.
		spec := p
		spec.Argv, spec.Dir = []string{"sh", "-c", "echo ran"}, "/"
		spec.Env = []string{"PATH=" + closed + ":/usr/bin:/bin"}
		if out, code := runToEnd(t, spec); code != 0 || out != "ran\n" {
			t.Errorf("isolate %v: sh through a PATH starting with a closed directory: exit %d output %q", p.Isolate, code, out)
		}
	}
	// Root still finds it.
	if out, code := runToEnd(t, sessiondir.Spec{Argv: []string{filepath.Join(closed, "tool")}, Dir: "/"}); code != 0 || out != "tool\n" {
		t.Errorf("as root: exit %d output %q", code, out)
	}
}

// TestOpenNoFollow: the walk used where openat2 is missing (kernels before
// 5.6) reaches directories below the root and refuses every symlink, out
// of the root or not.
func TestOpenNoFollow(t *testing.T) {
	f := newBeneathFixtureAs(t, os.Geteuid())
	rfd, err := unix.Open(f.ws, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(rfd)
	for rel, want := range map[string]error{"sub": nil, "sub/deeper": nil, "abs": unix.ENOTDIR, "in": unix.ENOTDIR, "sub/up": unix.ENOTDIR, "nope": unix.ENOENT} {
		fd, err := sessiondir.OpenNoFollow(rfd, rel)
		if err == nil {
			unix.Close(fd)
		}
		if !errors.Is(err, want) && !(want == unix.ENOTDIR && errors.Is(err, unix.ELOOP)) {
			t.Errorf("%s: %v, want %v", rel, err, want)
		}
	}
}
