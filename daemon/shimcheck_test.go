package daemon_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/daemon"
)

// TestShimCheckedAtStart: runnerd refuses to start when its shim is
// missing, not executable, a directory, or another build; it starts with
// the same build, and (with a warning) with a shim too old to say.
func TestShimCheckedAtStart(t *testing.T) {
	dir := t.TempDir()
	script := func(name, body string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const want = "v9.9.9-test"
	for _, tc := range []struct {
		name    string
		shim    string
		refused bool
	}{
		{"missing", filepath.Join(dir, "nope"), true},
		{"not executable", script("noexec", `echo `+want, 0o644), true},
		{"directory", dir, true},
		{"other version", script("other", `echo runner-shim v0.0.1`, 0o755), true},
		{"hangs up", script("fails", `kill -9 $$`, 0o755), true},
		{"same version", script("same", `echo runner-shim `+want, 0o755), false},
		{"no --version yet", script("old", `echo "flag provided but not defined: -version" >&2; exit 2`, 0o755), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			ready := make(chan struct{})
			errc := make(chan error, 1)
			go func() {
				errc <- daemon.Run(ctx, daemon.Config{StateDir: t.TempDir(), Token: testToken, NetPolicy: daemon.NetPolicyOff,
					Cgroups: daemon.CgroupsOff, Socket: "none", TCPListener: l, ShimCommand: []string{tc.shim, "serve"},
					WarmShims: -1, Version: want, Logger: testLogger(t), Ready: func(string) { close(ready) }})
			}()
			select {
			case err := <-errc:
				if !tc.refused {
					t.Fatalf("Run: %v, want it to start", err)
				}
				if !errors.Is(err, daemon.ErrShimUnusable) || !strings.Contains(err.Error(), tc.shim) {
					t.Fatalf("Run: %v, want ErrShimUnusable naming %s", err, tc.shim)
				}
			case <-ready:
				cancel()
				err := <-errc
				if tc.refused {
					t.Fatalf("Run started with shim %s, want refused", tc.shim)
				}
				if err != nil {
					t.Fatalf("Run: %v", err)
				}
			}
		})
	}
}

// TestRunnerdRefusesMissingShim: the real binary exits non-zero at once,
// with one error line that names the shim's path and the fix.
func TestRunnerdRefusesMissingShim(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "runner-shim")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, runnerdBin, "--shim", missing, "--state", t.TempDir(), "--listen", "127.0.0.1:0",
		"--socket", "none", "--netpolicy", "off", "--cgroups", "off", "--warm-shims", "0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("runnerd with a missing shim: %v (stderr %s), want exit 1", err, stderr.Bytes())
	}
	var errLines []string
	for _, line := range strings.Split(stderr.String(), "\n") {
		if strings.Contains(line, "level=ERROR") {
			errLines = append(errLines, line)
		}
	}
	if len(errLines) != 1 || !strings.Contains(errLines[0], missing) || !strings.Contains(errLines[0], "install runner-shim") {
		t.Fatalf("error lines %q, want one naming %s and the fix", errLines, missing)
	}
}
