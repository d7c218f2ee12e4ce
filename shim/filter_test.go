package shim

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

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
// a shim started by launch.Pool: a spec whose program was altered (the
// default action turned into allow) starts nothing, with the helper's
// error; the intact one (which the pool compiled, once) runs filtered.
func TestSpecFilterNotIntactRefused(t *testing.T) {
	shimtest.NeedRoot(t)
	spec := sessiondir.Spec{Argv: []string{"sh", "-c", "grep '^Seccomp:' /proc/self/status; echo ran"},
		Env: shimtest.TestEnv, User: "nobody", Isolate: true}
	okDir, _ := shimtest.Start(t, spec)
	e := shimtest.WaitExit(t, okDir)
	if out, want := shimtest.StdoutOf(t, okDir), "Seccomp:\t2\nran\n"; e.Code != 0 || out != want {
		t.Fatalf("intact: exit %d, %q; want 0 and %q", e.Code, out, want)
	}
	// The pool put its one compile in the spec, byte-identical to a fresh one.
	if have, err := sessiondir.ReadSpec(okDir); err != nil || !bytes.Equal(have.Seccomp, good(t)) {
		t.Fatalf("spec.json's program: %d bytes (%v), want a fresh compile's %d", len(have.Seccomp), err, len(good(t)))
	}
	spec.ID, spec.Seccomp = "altered", bytes.Clone(good(t))
	binary.LittleEndian.PutUint32(spec.Seccomp[len(spec.Seccomp)-sha256Len-4:], unix.SECCOMP_RET_ALLOW)
	dir := shimtest.SessionDir(t)
	_, err := shimtest.ColdStart(shimtest.CtxT(t, 30*time.Second), shimtest.ShimExe, dir, spec)
	if want := "check the seccomp program: seccomp: program not intact: checksum mismatch"; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("altered program: start got %v, want an error with %q", err, want)
	}
	if _, err := sessiondir.ReadStatus(dir); !errors.Is(err, sessiondir.ErrNoSession) {
		t.Fatalf("altered program: a session was left: %v", err)
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
