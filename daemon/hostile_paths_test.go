package daemon_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agentrunner/runner/internal/testcap"
	"github.com/agentrunner/runner/wire"
	"golang.org/x/sys/unix"
)

// Hostile paths: a sandbox's command can change every path below its
// workspace and its private /tmp, /var/tmp and /dev/shm, and runnerd and
// its shims run as root. Each test plants symlinks there (to another
// sandbox's project directory, to its private /var/tmp, whose name any
// sandbox reads in /proc/PID/mountinfo, to a directory under a 0700
// directory of the host's, as /root/go is) and then has runnerd use the
// path: nothing root does through it may land outside the sandbox.

// hostilePaths is two isolated sandboxes on a real runnerd (root,
// --isolate all) and what the hostile one aims at. Uid isolation, not the
// default pod: the attacks name host paths the sandbox sees (another
// sandbox's workspace, its private /var/tmp read from /proc/PID/mountinfo),
// and a pod sees neither (TestPodSandbox).
type hostilePaths struct {
	a                *api
	state            string
	hostile, victim  wire.Sandbox
	victimProject    string // victim's workspace/project, 0755: passable once inside
	victimTmp        string // victim's private /var/tmp on the host
	hostDir          string // a 0755 directory under a 0700 one of root's, as /root/go
	victimFiles      map[string]string
	victimSessionPID int
}

func newHostilePaths(t *testing.T) *hostilePaths {
	t.Helper()
	if os.Geteuid() != 0 {
		testcap.Skip(t, "root", "isolation (a uid per sandbox) needs a root runnerd")
	}
	h := &hostilePaths{state: passableTempDir(t)}
	h.a, _ = startRunnerdProc(t, nil, h.state, "", "--isolate", "all")
	h.hostile = h.a.createSandbox("hostile")
	h.victim = h.a.createSandbox("victim")
	if !h.hostile.Isolated || h.hostile.UID == nil || h.victim.UID == nil || *h.hostile.UID == *h.victim.UID {
		t.Fatalf("sandboxes not isolated with uids of their own: %+v %+v", h.hostile, h.victim)
	}
	h.victimProject = filepath.Join(h.victim.Workspace, "project")
	h.victimTmp = filepath.Join(h.state, "private", h.victim.Name+"-"+h.victim.Incarnation, "var-tmp")
	closed := t.TempDir() // 0700, root's
	h.hostDir = filepath.Join(closed, "go")
	if err := os.Mkdir(h.hostDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h.hostDir, "host-secret"), []byte("host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	h.a.run("victim", "sh", "-c", "umask 022; mkdir project; echo notes > project/notes; echo secret > secret; echo tmp > /var/tmp/victim-secret")
	h.victimFiles = map[string]string{
		filepath.Join(h.victimProject, "notes"):     "notes\n",
		filepath.Join(h.victim.Workspace, "secret"): "secret\n",
		filepath.Join(h.victimTmp, "victim-secret"): "tmp\n",
		filepath.Join(h.hostDir, "host-secret"):     "host\n",
	}
	// The victim runs a command: its mount table names its private
	// directories for anyone who can read /proc.
	h.victimSessionPID = h.a.spawn("victim", wire.CreateSession{ID: "victim-sleep", Argv: []string{"sleep", "600"}}).PID
	mi := h.a.run("hostile", "cat", fmt.Sprintf("/proc/%d/mountinfo", h.victimSessionPID))
	if !strings.Contains(mi, filepath.Join("private", h.victim.Name+"-"+h.victim.Incarnation, "var-tmp")) {
		t.Logf("the victim's private directory is not in its mountinfo as the hostile sandbox reads it (the attack guesses it instead):\n%s", mi)
	}
	return h
}

// plant makes the hostile sandbox's symlinks in its workspace, and in its
// private /var/tmp and /dev/shm.
func (h *hostilePaths) plant(t *testing.T) {
	t.Helper()
	script := fmt.Sprintf(`set -e
ln -s %[1]s to-project
ln -s %[2]s to-tmp
ln -s %[3]s to-host
ln -s /root to-root
ln -s ../.. up
mkdir -p sub inside
ln -s %[1]s sub/deep
ln -s %[1]s/notes notes-link
ln -s inside in-link
for d in /var/tmp /dev/shm; do ln -s %[1]s $d/to-project; ln -s %[2]s $d/to-tmp; ln -s %[3]s $d/to-host; done`, h.victimProject, h.victimTmp, h.hostDir)
	h.a.run("hostile", "sh", "-c", script)
}

// checkVictim fails the test if anything of the victim's, or the host
// directory, changed or gained a file.
func (h *hostilePaths) checkVictim(t *testing.T) {
	t.Helper()
	for p, want := range h.victimFiles {
		if got, err := os.ReadFile(p); err != nil || string(got) != want {
			t.Errorf("%s: %q, %v; want %q unchanged", p, got, err, want)
		}
	}
	for _, d := range []string{h.victimProject, h.victim.Workspace, h.victimTmp, h.hostDir, "/root"} {
		if _, err := os.Lstat(filepath.Join(d, "planted")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s/planted: %v, want absent: a command of the hostile sandbox ran there", d, err)
		}
	}
}

// TestHostileCwd: a spawn whose cwd goes through a symlink the sandbox
// planted never runs outside its workspace: it is refused (400 invalid,
// saying so) or, for a link that stays inside, runs inside. An absolute
// cwd outside the workspace is refused for an isolated sandbox. So is a
// cwd the sandbox swaps between a directory and such a link while the
// spawns run (runnerd's check and the shim's open see different things;
// the shim's, beneath the workspace, is the one that holds).
func TestHostileCwd(t *testing.T) {
	h := newHostilePaths(t)
	h.plant(t)
	argv := []string{"sh", "-c", "echo pwned > planted; pwd -P"}
	for _, c := range []struct {
		cwd, want string
	}{
		{"to-project", "resolves outside"},
		{"to-tmp", "resolves outside"},
		{"to-host", "resolves outside"},
		{"to-root", "resolves outside"},
		{"up", "resolves outside"},
		{"sub/deep", "resolves outside"},
		{filepath.Join(h.hostile.Workspace, "to-project"), "resolves outside"},
		{h.victimProject, "outside the sandbox's workspace"},
		{h.victimTmp, "outside the sandbox's workspace"},
		{h.hostDir, "outside the sandbox's workspace"},
		{"/", "outside the sandbox's workspace"},
		{"../victim/project", "outside the sandbox's workspace"},
	} {
		r := h.a.do("POST", "/v1/sandboxes/hostile/sessions", wire.CreateSession{Argv: argv, Cwd: c.cwd})
		if r.status != http.StatusBadRequest || r.code() != wire.CodeInvalid {
			t.Errorf("cwd %q: got %d %s, want 400 invalid", c.cwd, r.status, r.body)
			continue
		}
		if d := r.errBody(t).Detail; !strings.Contains(d, c.want) {
			t.Errorf("cwd %q: detail %q, want it to say %q", c.cwd, d, c.want)
		}
	}
	// A link that stays inside is followed; the workspace is the default;
	// a path is cleaned before it is resolved (to-project/.. is the
	// workspace, not the victim's).
	for cwd, want := range map[string]string{"in-link": filepath.Join(h.hostile.Workspace, "inside"), "": h.hostile.Workspace, "to-project/..": h.hostile.Workspace} {
		res := h.a.exec("hostile", wire.Exec{Argv: []string{"pwd", "-P"}, Cwd: cwd, TimeoutMS: 20000})
		if res.Exit.Code != 0 || strings.TrimSpace(string(res.Stdout)) != want {
			t.Errorf("cwd %q: exit %+v stdout %q, want %s", cwd, res.Exit, res.Stdout, want)
		}
	}
	h.checkVictim(t)

	// The race: the sandbox swaps "flip" between a directory of its own
	// and a link to the victim's project while spawns start there.
	h.a.run("hostile", "sh", "-c", fmt.Sprintf("mkdir real && ln -s %s link && mv -T real flip", h.victimProject))
	h.a.spawn("hostile", wire.CreateSession{ID: "flipper", Argv: []string{"sh", "-c",
		"while :; do mv -T flip real; mv -T link flip; mv -T flip link; mv -T real flip; done"}})
	outcomes := map[string]int{}
	for i := range 60 {
		r := h.a.do("POST", "/v1/sandboxes/hostile/exec", wire.Exec{Argv: []string{"sh", "-c", fmt.Sprintf("echo pwned > planted-%d; pwd -P", i)}, Cwd: "flip", TimeoutMS: 20000})
		switch {
		case r.status == http.StatusOK:
			var res wire.ExecResult
			if err := json.Unmarshal(r.body, &res); err != nil {
				t.Fatal(err)
			}
			got := strings.TrimSpace(string(res.Stdout))
			if !strings.HasPrefix(got, h.hostile.Workspace+"/") {
				t.Errorf("spawn %d in flip: ran in %q (exit %+v), outside the workspace %s", i, got, res.Exit, h.hostile.Workspace)
			}
			outcomes["ran inside"]++
		case r.status == http.StatusBadRequest && r.code() == wire.CodeInvalid:
			d := r.errBody(t).Detail
			switch {
			case strings.Contains(d, "resolves outside"):
				outcomes["refused: outside"]++
			case strings.Contains(d, "not a directory"), strings.Contains(d, "no such file"):
				outcomes["refused: absent"]++ // between two renames
			default:
				t.Errorf("spawn %d in flip: detail %q", i, d)
			}
		default:
			t.Errorf("spawn %d in flip: got %d %s", i, r.status, r.body)
		}
	}
	t.Logf("spawns in a cwd swapped with a link out: %v", outcomes)
	h.a.must("POST", "/v1/sandboxes/hostile/sessions/flipper/signal", `{"signal":"KILL"}`, 204, nil)
	ents, _ := os.ReadDir(h.victimProject)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "planted") {
			t.Errorf("%s/%s: a command of the hostile sandbox ran in the victim's project", h.victimProject, e.Name())
		}
	}
	h.checkVictim(t)
}

// TestHostileDestroy: destroying a sandbox whose workspace and private
// /var/tmp and /dev/shm hold links to the victim's project, its private
// /var/tmp and a host directory removes the links, never what they point
// to (os.RemoveAll works from directory descriptors, opens each
// directory with O_NOFOLLOW and unlinks entries with unlinkat).
func TestHostileDestroy(t *testing.T) {
	h := newHostilePaths(t)
	h.plant(t)
	// Links where a directory was, one level down too: RemoveAll descends
	// into directories, never into a link.
	h.a.run("hostile", "sh", "-c", fmt.Sprintf("mkdir -p deep/er && ln -s %s deep/er/victim && ln -s %s deep/host", h.victimProject, h.hostDir))
	priv := filepath.Join(h.state, "private", h.hostile.Name+"-"+h.hostile.Incarnation)
	if _, err := os.Lstat(filepath.Join(priv, "shm", "to-project")); err != nil {
		t.Fatalf("the planted link in the private /dev/shm: %v", err)
	}
	// Its bind sources are out of its reach: it cannot list, replace or
	// add to its private directory's parent, nor move its mount points.
	script := fmt.Sprintf(`ls %[1]s >/dev/null 2>&1 && echo listed
ln -s / %[1]s/x 2>/dev/null && echo linked
ln -s / %[2]s/tmp.x 2>/dev/null && echo linked-in-private
mv -T /var/tmp /var/tmp.x 2>/dev/null && echo moved
rmdir /dev/shm 2>/dev/null && echo removed
echo done`, filepath.Join(h.state, "private"), priv)
	if got := h.a.run("hostile", "sh", "-c", script); got != "done" {
		t.Errorf("the sandbox changed its private directory's entries: %q", got)
	}
	h.a.must("DELETE", "/v1/sandboxes/hostile", nil, 204, nil)
	for _, p := range []string{h.hostile.Workspace, priv} {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s after destroy: %v, want gone", p, err)
		}
	}
	h.checkVictim(t)
	for _, d := range []string{h.victimProject, h.victimTmp, h.hostDir} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s after the hostile sandbox's destroy: %v", d, err)
		}
	}
	if got := h.a.run("victim", "cat", "project/notes", "/var/tmp/victim-secret"); got != "notes\ntmp" {
		t.Errorf("the victim reads %q, want its files", got)
	}
}

// TestRemoveAllRaceSymlinkSwap is the property destroy relies on should a
// process of the sandbox outlive its sessions (a host without cgroups): a
// tree whose directories are swapped with links to a victim while
// os.RemoveAll removes it loses only its own entries.
func TestRemoveAllRaceSymlinkSwap(t *testing.T) {
	base := t.TempDir()
	victim := filepath.Join(base, "victim")
	if err := os.MkdirAll(filepath.Join(victim, "keep"), 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		if err := os.WriteFile(filepath.Join(victim, "keep", fmt.Sprint(i)), []byte("v"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	failed := 0
	for round := range 40 {
		tree := filepath.Join(base, fmt.Sprintf("tree-%d", round))
		for i := range 20 {
			d := filepath.Join(tree, fmt.Sprint(i), "sub")
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(d, "f"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(filepath.Join(victim, "keep"), filepath.Join(tree, fmt.Sprint(i), "link")); err != nil {
				t.Fatal(err)
			}
		}
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				for i := range 20 {
					select {
					case <-stop:
						return
					default:
					}
					d := filepath.Join(tree, fmt.Sprint(i))
					unix.Renameat2(unix.AT_FDCWD, filepath.Join(d, "sub"), unix.AT_FDCWD, filepath.Join(d, "link"), unix.RENAME_EXCHANGE)
				}
			}
		}()
		err := os.RemoveAll(tree)
		close(stop)
		<-done
		os.RemoveAll(tree) // the swapper may have been mid-rename
		if err != nil {
			failed++ // ENOTDIR: a swap under it; destroy answers unavailable and a retry ends it
		}
		ents, err := os.ReadDir(filepath.Join(victim, "keep"))
		if err != nil || len(ents) != 50 {
			t.Fatalf("round %d: the victim's directory holds %d entries (%v), want 50", round, len(ents), err)
		}
	}
	t.Logf("%d of 40 removals met a swap and failed; none touched the victim", failed)
}

// TestHostileCheckpoint: a checkpoint of a workspace holding links to the
// victim captures the links (the walk never follows one, files are read
// with O_NOFOLLOW while the sandbox is frozen), and a restore puts links
// back as links into a fresh tree (never writing through a link the
// sandbox left in the old one), owned by the sandbox: the victim's files
// are neither captured nor changed.
func TestHostileCheckpoint(t *testing.T) {
	h := newHostilePaths(t)
	if !slices.Contains(h.a.capabilities(), wire.CapCheckpoint) {
		testcap.Skip(t, "cgroup freezer", "checkpoints need the cgroup freezer")
	}
	h.plant(t)
	h.a.run("hostile", "sh", "-c", "echo mine > mine")
	var ck wire.Checkpoint
	h.a.must("POST", "/v1/sandboxes/hostile/checkpoints", wire.CreateCheckpoint{}, 201, &ck)
	if ck.Files != 1 || ck.Size != int64(len("mine\n")) {
		t.Errorf("checkpoint: %d files, %d bytes; want 1 file of %d bytes (its own, none of the victim's)", ck.Files, ck.Size, len("mine\n"))
	}
	// Before the restore: "sub" and "inside" become links to the victim's
	// project, where a restore writing by path would land.
	h.a.run("hostile", "sh", "-c", fmt.Sprintf("rm -rf sub inside && ln -s %[1]s sub && ln -s %[1]s inside", h.victimProject))
	var sb wire.Sandbox
	h.a.must("POST", "/v1/sandboxes/hostile/checkpoints/"+ck.ID+"/restore", nil, 200, &sb)
	for link, want := range map[string]string{"to-project": h.victimProject, "to-tmp": h.victimTmp, "to-host": h.hostDir, "sub/deep": h.victimProject, "in-link": "inside",
		"notes-link": filepath.Join(h.victimProject, "notes")} {
		if got, err := os.Readlink(filepath.Join(h.hostile.Workspace, link)); err != nil || got != want {
			t.Errorf("restored %s: %q, %v; want a link to %s", link, got, err, want)
		}
	}
	for _, d := range []string{"sub", "inside"} {
		p := filepath.Join(h.hostile.Workspace, d)
		if u, _, mode := ownerOf(t, p); !mode.IsDir() || u != *h.hostile.UID {
			t.Errorf("restored %s: %v owned by %d, want a directory of uid %d", p, mode, u, *h.hostile.UID)
		}
	}
	if got := h.a.run("hostile", "cat", "mine"); got != "mine" {
		t.Errorf("restored mine: %q", got)
	}
	ents, err := os.ReadDir(h.victimProject)
	if err != nil || len(ents) != 1 || ents[0].Name() != "notes" {
		t.Errorf("the victim's project after the restore: %v, %v; want notes alone", ents, err)
	}
	h.checkVictim(t)
}
