package cli

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/internal/runnerdtest"
	"github.com/agentrunner/runner/internal/testcap"
	"github.com/agentrunner/runner/netpolicy/netlab"
)

// The README's "A 30-second tour" is the first thing a reader runs, and
// it drifted from what runs five times in two rounds (a uid, a table's
// moment, a hint...). TestReadmeTour runs it: every `$ ` line of its
// console block, in order, against a real root runnerd (internal/
// runnerdtest) with isolation, network containment (inside a netlab lab,
// never the host's network; runnerd's default --egress-private) and
// cgroups (a root of the test's own), and
// compares the output the README shows with what the command prints, by
// shape: numbers, the state directory and the binaries' directory
// normalised (tourShape), so a uid or a byte count may differ but a line
// that appears, vanishes or reads differently fails the test.
//
// What it checks per command: where the README shows output lines, the
// shape of every line (stdout and stderr on one pipe, as a terminal
// shows them); where it shows none (output elided: info, ps, a stream),
// that the command line exits 0. Commands are run by bash with
// `sudo ` dropped (the test is root), bin/ pointing at the test's build
// and /var/lib/runnerd at the daemon's state directory.
//
// tourSkipped is the documented marker of what is not run: commands that
// take a terminal or never end. Each of its entries must be a command of
// the tour (a stale entry fails the test), so nothing is skipped by
// accident and a new interactive line must be named here to pass.
var tourSkipped = map[string]string{
	"bin/runner exec -it demo -- bash":          "takes a terminal (exec -it)",
	"bin/runner run dev --id sh -- bash":        "takes a terminal (run attaches)",
	"bin/runner attach demo shell":              "takes a terminal (attach)",
	"bin/runner logs demo shell -f":             "never ends (-f follows a live bash)",
	"bin/runner attach demo shell --cursor 166": "takes a terminal (attach)",
}

// tourCommand is one `$ ` line of the tour and the output shown under it.
type tourCommand struct {
	line int    // in README.md
	cmd  string // as shown, comment included
	want []string
}

// readTour parses the console block under README.md's "## A 30-second
// tour".
func readTour(t *testing.T) []tourCommand {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var (
		cmds             []tourCommand
		inSection, inBox bool
	)
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		l := sc.Text()
		switch {
		case strings.HasPrefix(l, "## "):
			if inSection && len(cmds) > 0 {
				return cmds
			}
			inSection = l == "## A 30-second tour"
		case !inSection:
		case !inBox && l == "```console":
			inBox = true
		case inBox && l == "```":
			return cmds
		case inBox && strings.HasPrefix(l, "$ "):
			cmds = append(cmds, tourCommand{line: n, cmd: strings.TrimPrefix(l, "$ ")})
		case inBox && len(cmds) > 0:
			cmds[len(cmds)-1].want = append(cmds[len(cmds)-1].want, l)
		case inBox:
			t.Fatalf("README.md:%d: output before the tour's first command: %q", n, l)
		}
	}
	t.Fatal(`README.md: no console block under "## A 30-second tour"`)
	return nil
}

// commentRe is a shell comment at the end of a tour line.
var commentRe = regexp.MustCompile(`\s+#\s.*$`)

// tourKey is a tour line without its comment, for tourSkipped.
func tourKey(cmd string) string {
	return strings.TrimSpace(commentRe.ReplaceAllString(cmd, ""))
}

var digitsRe = regexp.MustCompile(`[0-9]+`)

// tourShape normalises a line of output: the state directory reads
// /var/lib/runnerd, the binaries' directory bin, every run of digits N,
// trailing blanks go.
func tourShape(line, state string) string {
	if state != "" {
		line = strings.ReplaceAll(line, state, "/var/lib/runnerd")
		line = strings.ReplaceAll(line, binDir+"/", "bin/")
	}
	return strings.TrimRight(digitsRe.ReplaceAllString(line, "N"), " \t")
}

func TestReadmeTour(t *testing.T) {
	testcap.Root(t, "the README's tour runs a root runnerd (isolation, containment, limits)")
	cmds := readTour(t)
	if len(cmds) < 10 {
		t.Fatalf("README.md's tour has %d commands; the parser lost it", len(cmds))
	}
	seen := map[string]bool{}
	for _, c := range cmds {
		seen[tourKey(c.cmd)] = true
	}
	for k := range tourSkipped {
		if !seen[k] {
			t.Errorf("tourSkipped names %q, which is no longer a command of the tour: remove it", k)
		}
	}

	lab := netlab.New(t)
	// runnerd's default egress, as `sudo bin/runnerd` runs it (netlab
	// passes --egress-private allow unless told): the tour shows a default
	// sandbox's network, so the test must see the default, and no tour
	// line reaches the lab's outside (a private range).
	lab.EgressPrivate = "default"
	netState := t.TempDir()
	t.Cleanup(func() { netlab.UnmountLeftovers(netState) })
	var rnd [6]byte
	rand.Read(rnd[:])
	cgRoot := "/runner-tour-" + hex.EncodeToString(rnd[:])
	t.Cleanup(func() {
		dirs, _ := filepath.Glob("/sys/fs/cgroup/*" + cgRoot)
		if _, err := os.Stat("/sys/fs/cgroup" + cgRoot); err == nil {
			dirs = append(dirs, "/sys/fs/cgroup"+cgRoot)
		}
		removeCgroupTrees(t, dirs)
	})
	d := runnerdtest.Start(t, filepath.Join(binDir, "runnerd"),
		append(lab.RunnerdArgs(netState), "--cgroups", "auto", "--cgroup-root", cgRoot)...)
	t.Cleanup(d.Stop)
	// An isolated sandbox's uid passes the state directory to reach its
	// workspace, as /var/lib/runnerd (0711 under systemd) lets it.
	if err := os.Chmod(d.State, 0o711); err != nil {
		t.Fatal(err)
	}
	env := cliEnv("RUNNERD_URL="+d.URL(), "RUNNERD_STATE="+d.State)
	t.Cleanup(func() {
		for _, sb := range []string{"demo", "dev", "box"} {
			runCLIEnv(env, nil, "rm", sb)
		}
	})

	for _, c := range cmds {
		key := tourKey(c.cmd)
		if why, ok := tourSkipped[key]; ok {
			t.Logf("README.md:%d: skipped (%s): %s", c.line, why, key)
			continue
		}
		line := strings.ReplaceAll(c.cmd, "sudo ", "")
		line = strings.ReplaceAll(line, "bin/runner", filepath.Join(binDir, "runner"))
		line = strings.ReplaceAll(line, "/var/lib/runnerd", d.State)
		out, code := runTourLine(line, env)
		got := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		if out == "" {
			got = nil
		}
		if strings.Contains(key, "id -u") && len(got) > 0 && len(c.want) > 0 {
			checkTourUID(t, c.line, d.State, got[0], c.want[0])
		}
		if len(c.want) == 0 {
			if code != 0 {
				t.Errorf("README.md:%d: $ %s\nexit %d, want 0; output:\n%s", c.line, c.cmd, code, out)
			}
			continue
		}
		var gotShape, wantShape []string
		for _, l := range got {
			gotShape = append(gotShape, tourShape(l, d.State))
		}
		for _, l := range c.want {
			wantShape = append(wantShape, tourShape(l, ""))
		}
		if strings.Join(gotShape, "\n") != strings.Join(wantShape, "\n") {
			t.Errorf("README.md:%d: $ %s\nthe README shows:\n%s\nit prints (exit %d):\n%s\nshapes: got %q, want %q",
				c.line, c.cmd, strings.Join(c.want, "\n"), code, out, gotShape, wantShape)
		}
	}
}

// checkTourUID: the uid the tour shows is not a shape but a fact (it was
// stale once): the first sandbox of a fresh state directory gets the
// first uid of the directory's identity range (as this daemon's did,
// read from STATE/identity-range), and the README's is the first of
// /var/lib/runnerd's default range.
func checkTourUID(t *testing.T, line int, state, got, shown string) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(state, "subid-range")); err == nil {
		// A pod (runnerd's default where it can make pods): root inside.
		if got != "0" || shown != "0" {
			t.Errorf("README.md:%d: id -u in a pod: runs %s, the tour shows %s; want 0", line, got, shown)
		}
		return
	}
	b, err := os.ReadFile(filepath.Join(state, "identity-range"))
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(strings.TrimSpace(string(b)), "-")
	if got != first {
		t.Errorf("README.md:%d: the first sandbox runs as uid %s, not the first of its identity range %s", line, got, b)
	}
	// The formula below is the daemon's (unless another live runnerd
	// held this directory's slot: one chance in 4,094 per such runnerd).
	if want := fmt.Sprint(defaultIdentityFirst(state)); first != want {
		t.Errorf("runnerd chose identity range %s for %s; defaultIdentityFirst says %s: update it from daemon/claim.go", b, state, want)
	}
	if want := fmt.Sprint(defaultIdentityFirst("/var/lib/runnerd")); shown != want {
		t.Errorf("README.md:%d: the tour shows uid %s; the first sandbox of a fresh /var/lib/runnerd runs as %s", line, shown, want)
	}
}

// defaultIdentityFirst is the first uid of the identity range runnerd
// picks for a fresh state directory when no other runnerd holds it
// (daemon/claim.go: 65,536-id slots from 0x70000000 below 0x7FFE0000, the
// slot from the SHA-256 of the directory's path). checkTourUID holds it
// to the daemon's own choice for the tour's state directory.
func defaultIdentityFirst(state string) uint32 {
	const first, size, end = 0x70000000, 1 << 16, 0x7FFE0000
	sum := sha256.Sum256([]byte(state))
	return first + binary.BigEndian.Uint32(sum[:4])%((end-first)/size)*size
}

// runTourLine runs a tour line in bash with env, stdout and stderr on one
// pipe, and returns what it printed and its exit code.
func runTourLine(line string, env []string) (string, int) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", line)
	cmd.Env = env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	code := cmd.ProcessState.ExitCode()
	if err != nil && code < 0 {
		return out.String() + fmt.Sprintf("[%v]", err), -1
	}
	return out.String(), code
}
