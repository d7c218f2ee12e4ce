package shim

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/agentrunner/runner/seccomp"
	"github.com/agentrunner/runner/shim/internal/shimtest"
	"github.com/agentrunner/runner/shim/sessiondir"
	"golang.org/x/sys/unix"
)

// TestFilterCompiledOnce: an isolated start's plan carries the program
// the shim compiled once, byte-identical to a fresh compile, and the same
// bytes at every start of the process.
func TestFilterCompiledOnce(t *testing.T) {
	fresh, err := seccomp.Default()
	if err != nil {
		t.Fatal(err)
	}
	want, err := fresh.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var plans [2]*execPlan
	for i := range plans {
		cmd := &exec.Cmd{Path: "/bin/true", Args: []string{"true"}, SysProcAttr: &syscall.SysProcAttr{
			Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}}
		if plans[i], err = newExecPlan(cmd, sessiondir.Spec{Argv: []string{"true"}, User: "nobody", Isolate: true}); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(plans[0].Seccomp, want) {
		t.Fatalf("plan's program (%d bytes) differs from a fresh compile (%d bytes)", len(plans[0].Seccomp), len(want))
	}
	if &plans[0].Seccomp[0] != &plans[1].Seccomp[0] {
		t.Error("the second start's program was compiled again, not the shim's one compile")
	}
	// A spec that brings the launcher's compile: its bytes, as they came.
	given := bytes.Clone(want)
	cmd := &exec.Cmd{Path: "/bin/true", Args: []string{"true"}, SysProcAttr: &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}}
	p, err := newExecPlan(cmd, sessiondir.Spec{Argv: []string{"true"}, User: "nobody", Isolate: true, Seccomp: given})
	if err != nil || &p.Seccomp[0] != &given[0] {
		t.Fatalf("a spec with a program: the plan does not carry it (%v)", err)
	}
	p, err = newExecPlan(&exec.Cmd{Path: "/bin/true", Args: []string{"true"}, SysProcAttr: &syscall.SysProcAttr{}},
		sessiondir.Spec{Argv: []string{"true"}})
	if err != nil || p.Seccomp != nil {
		t.Fatalf("a start without Isolate or Pod: program of %d bytes (%v), want none", len(p.Seccomp), err)
	}
}

// TestFilterNotIntactRefused is the attack on the precompiled filter: a
// helper handed no program, a program cut short, or one altered to allow
// every call must refuse the start; the command never runs, filtered or
// not. The intact program is the control: the command runs, under a
// filter.
func TestFilterNotIntactRefused(t *testing.T) {
	shimtest.NeedRoot(t)
	good, err := compiledFilter()
	if err != nil {
		t.Fatal(err)
	}
	allowAll := bytes.Clone(good)
	// The last instruction is the profile's default action (EPERM):
	// allow instead, a program the kernel takes and that denies nothing
	// but what the rules name.
	binary.LittleEndian.PutUint32(allowAll[len(allowAll)-sha256Len-4:], unix.SECCOMP_RET_ALLOW)
	for _, tc := range []struct {
		name string
		prog []byte
		want string // in the start error; "" for the control
	}{
		{"intact", good, ""},
		{"none", nil, "the plan carries no seccomp program"},
		{"truncated", good[:len(good)-sha256Len-8], "check the seccomp program: seccomp: program not intact"},
		{"default action turned into allow", allowAll, "check the seccomp program: seccomp: program not intact: checksum mismatch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := os.CreateTemp(t.TempDir(), "out")
			if err != nil {
				t.Fatal(err)
			}
			defer out.Close()
			cmd := &exec.Cmd{Path: "/bin/sh", Args: []string{"sh", "-c", "grep '^Seccomp:' /proc/self/status; echo ran"},
				Env: []string{}, Stdout: out, Stderr: out,
				SysProcAttr: &syscall.SysProcAttr{Setsid: true, Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}}
			p, err := newExecPlan(cmd, sessiondir.Spec{Argv: cmd.Args, User: "nobody", Isolate: true})
			if err != nil {
				t.Fatal(err)
			}
			p.Seccomp = tc.prog
			err = startNsexec(cmd, p)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("start: %v", err)
				}
				cmd.Wait()
			} else if err == nil || !strings.Contains(err.Error(), tc.want) {
				cmd.Wait()
				t.Errorf("start: got %v, want an error with %q", err, tc.want)
			}
			got, _ := os.ReadFile(out.Name())
			want := ""
			if tc.want == "" {
				want = "Seccomp:\t2\nran\n"
			}
			if string(got) != want {
				t.Errorf("command's output: got %q, want %q", got, want)
			}
		})
	}
}

// TestSpecFilterNotIntactRefused is the same attack end to end, through
// a shim: a spec.json whose program was altered (the default action
// turned into allow) starts nothing, with the helper's error; the intact
// one, which launch.Pool compiled once and put in the spec (replacing
// whatever program the caller's spec had), runs filtered.
func TestSpecFilterNotIntactRefused(t *testing.T) {
	shimtest.NeedRoot(t)
	altered := bytes.Clone(good(t))
	binary.LittleEndian.PutUint32(altered[len(altered)-sha256Len-4:], unix.SECCOMP_RET_ALLOW)
	spec := sessiondir.Spec{ID: "intact", Argv: []string{"sh", "-c", "grep '^Seccomp:' /proc/self/status; echo ran"},
		Env: shimtest.TestEnv, User: "nobody", Isolate: true, Seccomp: altered}
	okDir, _ := shimtest.Start(t, spec)
	e := shimtest.WaitExit(t, okDir)
	if out, want := shimtest.StdoutOf(t, okDir), "Seccomp:\t2\nran\n"; e.Code != 0 || out != want {
		t.Fatalf("intact: exit %d, %q; want 0 and %q", e.Code, out, want)
	}
	// The pool put its one compile in the spec, byte-identical to a fresh one.
	if have, err := sessiondir.ReadSpec(okDir); err != nil || !bytes.Equal(have.Seccomp, good(t)) {
		t.Fatalf("spec.json's program: %d bytes (%v), want a fresh compile's %d", len(have.Seccomp), err, len(good(t)))
	}

	// The altered program in spec.json, the shim run on it directly.
	dir := shimtest.SessionDir(t)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	spec.ID = "altered"
	b, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(dir, sessiondir.SpecFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(shimtest.ShimExe[0], "session", dir)
	log, err := cmd.CombinedOutput()
	if want := "check the seccomp program: seccomp: program not intact: checksum mismatch"; err == nil || !strings.Contains(string(log), want) {
		t.Fatalf("altered program: shim got %v, %q; want a failure saying %q", err, log, want)
	}
	if _, err := os.Stat(filepath.Join(dir, sessiondir.StartedFile)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("altered program: %s: %v, want none (nothing started)", sessiondir.StartedFile, err)
	}
}

func good(t *testing.T) []byte {
	t.Helper()
	f, err := seccomp.Default()
	if err != nil {
		t.Fatal(err)
	}
	b, err := f.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// sha256Len is the length of the program's checksum (seccomp's encoding).
const sha256Len = 32
