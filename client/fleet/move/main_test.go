package move_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/client/fleet/move"
	"github.com/agentrunner/runner/internal/runnerdtest"
	"github.com/agentrunner/runner/internal/s3test"
	"github.com/agentrunner/runner/internal/testcap"
)

// runnerdBin is the real runnerd, built once in TestMain.
var runnerdBin string

// claimDir is where this package's runnerds claim their identity ranges
// and cgroup roots; TestMain removes it.
var claimDir string

func TestMain(m *testing.M) {
	code := runnerdtest.Main(m, "move-test-", func(bin string) error { runnerdBin = bin; return nil })
	if claimDir != "" {
		os.RemoveAll(claimDir)
	}
	os.Exit(code)
}

const token = "move-test-token-0123456789"

// runnerd is a real runnerd a test started on an address of its choice,
// with cgroups (the freezer: checkpoints) under a cgroup root of its own.
type runnerd struct {
	addr, state string
}

func (r *runnerd) url() string { return "http://" + r.addr }

// needCheckpoints skips (loudly) where runnerd cannot checkpoint.
func needCheckpoints(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		testcap.Skip(t, "root", "checkpoints need cgroups")
	}
	if _, err := os.Stat("/sys/fs/cgroup/freezer"); err != nil {
		if _, err2 := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err2 != nil {
			testcap.Skip(t, "cgroup freezer", err.Error())
		}
	}
}

// freeAddr returns a loopback address nothing listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startRunnerd runs runnerd on addr with the shared token. Cleanup
// destroys its sandboxes through its API (their sessions with them),
// stops it by pid, kills any shim its state still names, and removes its
// cgroup root.
func startRunnerd(t *testing.T, addr string) *runnerd {
	t.Helper()
	if claimDir == "" {
		// One claim directory for the package's runnerds: they claim
		// distinct identity ranges and cgroup roots against each other
		// without waiting on the host's claim lock, which other test
		// processes' runnerds take too.
		claimDir = filepath.Join(os.TempDir(), fmt.Sprintf("runner-move-claims-%d", os.Getpid()))
	}
	state := t.TempDir()
	if err := os.Chmod(filepath.Dir(state), 0o711); err != nil { // sandboxes' own uids pass it
		t.Fatal(err)
	}
	root := fmt.Sprintf("/runner-move-test-%d-%s-%s", os.Getpid(), filepath.Base(filepath.Dir(state)), filepath.Base(state))
	cmd := exec.Command(runnerdBin, "--state", state, "--listen", addr, "--socket", "none", "--netpolicy", "off",
		"--cgroups", "auto", "--cgroup-root", root, "--warm-shims", "0", "--claim-dir", claimDir)
	cmd.Env = append(os.Environ(), "RUNNERD_TOKEN="+token)
	log, err := os.Create(filepath.Join(state, "runnerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &runnerd{addr: addr, state: state}
	t.Cleanup(func() {
		if c, err := client.New(r.url(), token, client.Options{}); err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			if sbs, err := c.ListAllSandboxes(ctx); err == nil {
				for _, sb := range sbs {
					_ = c.DeleteSandbox(ctx, sb.Name)
				}
			}
			cancel()
			c.Close()
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		runnerdtest.KillShims(state)
		log.Close()
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(state, "runnerd.log"))
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			t.Logf("runnerd %s log tail:\n%s", addr, b)
		}
		dirs, _ := filepath.Glob("/sys/fs/cgroup/*" + root)
		for _, d := range dirs {
			os.Remove(d)
		}
	})
	var last error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		resp, err := http.Get(r.url() + "/healthz")
		if err == nil {
			resp.Body.Close()
			return r
		}
		last = err
	}
	b, _ := os.ReadFile(filepath.Join(state, "runnerd.log"))
	t.Fatalf("runnerd on %s did not answer (%v): %s", addr, last, b)
	return nil
}

// openStore opens the test server's bucket with its credentials, under a
// prefix of the test's own.
func openStore(t *testing.T, srv *s3test.Server) (*move.Store, move.Config) {
	t.Helper()
	tr := srv.Transport()
	t.Cleanup(tr.CloseIdleConnections)
	cfg := move.Config{Endpoint: srv.Endpoint, Bucket: srv.Bucket, Prefix: t.Name() + "/",
		Credentials: move.Credentials{AccessKeyID: srv.AccessKeyID, SecretAccessKey: srv.SecretAccessKey}, Transport: tr}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := move.Open(ctx, cfg)
	if err != nil {
		t.Fatalf("open bucket: %v", err)
	}
	return st, cfg
}
