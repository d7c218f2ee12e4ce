package e2b_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/e2b"
	"github.com/agentrunner/runner/internal/testcap"
)

// realEnvdChild marks the re-executed test that runs inside the network
// and mount namespaces TestRealEnvd makes.
const realEnvdChild = "RUNNER_TEST_ENVD_CHILD"

// TestRealEnvd runs envdChecks, the points the stand-in reproduces,
// against a real envd: RUNNER_TEST_ENVD=/path/to/envd (0.6.13, built
// from e2b-dev/infra packages/envd; never committed). Opt-in and
// root-only. envd listens on every interface, so it runs in a network
// namespace of its own (only its loopback), and in a mount namespace
// whose /etc/passwd and /etc/group add E2B's "user" (uid 2001) and whose
// /home and /run are tmpfs: the host is left as it was.
func TestRealEnvd(t *testing.T) {
	bin := os.Getenv("RUNNER_TEST_ENVD")
	if bin == "" {
		t.Skip("RUNNER_TEST_ENVD=/path/to/envd runs the stand-in's fidelity checks against a real envd 0.6.13")
	}
	if os.Getenv(realEnvdChild) == "" {
		testcap.Root(t, "a real envd runs in network and mount namespaces the test makes")
		cmd := exec.CommandContext(t.Context(), "unshare", "--net", "--mount", "--propagation", "private",
			os.Args[0], "-test.run=^TestRealEnvd$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), realEnvdChild+"=1")
		out, err := cmd.CombinedOutput()
		t.Logf("in the namespaces:\n%s", out)
		if err != nil {
			t.Fatalf("the checks against envd failed: %v", err)
		}
		return
	}
	sh := func(name string, args ...string) {
		t.Helper()
		if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
	}
	sh("ip", "link", "set", "lo", "up")
	// envd writes /run/e2b/.E2B_SANDBOX at start: a tmpfs takes it.
	for _, dir := range []string{"/home", "/run"} {
		sh("mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", dir)
	}
	for file, line := range map[string]string{"/etc/passwd": "user:x:2001:2001::/home/user:/bin/sh\n", "/etc/group": "user:x:2001:\n"} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(t.TempDir(), filepath.Base(file))
		if err := os.WriteFile(tmp, append(b, line...), 0o644); err != nil {
			t.Fatal(err)
		}
		sh("mount", "--bind", tmp, file)
	}
	if err := os.MkdirAll("/home/user", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown("/home/user", 2001, 2001); err != nil {
		t.Fatal(err)
	}

	const port = "49983"
	var logs bytes.Buffer
	envd := exec.Command(bin, "-isnotfc", "-no-cgroups", "-port", port)
	envd.Stdout, envd.Stderr = &logs, &logs
	if err := envd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		envd.Process.Signal(syscall.SIGKILL)
		envd.Wait()
		if t.Failed() {
			t.Logf("envd's output:\n%s", logs.String())
		}
	})
	base := "http://127.0.0.1:" + port
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	for {
		resp, err := http.Get(base + "/health")
		if err == nil {
			resp.Body.Close()
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("envd did not answer /health: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	token := "real-envd-token"
	resp, err := http.Post(base+"/init", "application/json", strings.NewReader(fmt.Sprintf(`{"accessToken":%q,"defaultUser":"user","defaultWorkdir":"/home/user"}`, token)))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("POST /init: %d %s", resp.StatusCode, b)
	}

	client := func(t *testing.T, user string) *e2b.Client {
		c, err := e2b.New(e2b.Config{APIKey: e2b.NewSecret("e2b_unused"), APIURL: "http://127.0.0.1:1", SandboxURL: base, User: user})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	x := envdTarget{
		as: func(t *testing.T, user string) *e2b.Envd {
			return client(t, user).Envd(e2b.Sandbox{SandboxID: "real", EnvdAccessToken: e2b.NewSecret(token)})
		},
		home:     "/home/user",
		inVM:     "false",
		switches: true,
	}
	for _, c := range envdChecks {
		t.Run(c.name, func(t *testing.T) { c.check(t, x) })
	}
	t.Run("BadToken", func(t *testing.T) {
		_, err := client(t, "").Envd(e2b.Sandbox{SandboxID: "real", EnvdAccessToken: e2b.NewSecret("wrong")}).List(ctxFor(t))
		if !errors.Is(err, adapter.ErrDenied) {
			t.Errorf("list with a wrong token: %v, want denied", err)
		}
		req, _ := http.NewRequest("POST", base+"/process.Process/List", strings.NewReader("{}"))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Connect-Protocol-Version", "1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		// The same bytes e2btest.TestEnvdStartRaw pins for the stand-in.
		want := `{"code":401,"message":"unauthorized access, please provide a valid access token or method signing if supported"}` + "\n"
		if resp.StatusCode != 401 || string(b) != want || resp.Header.Get("Content-Type") != "application/json; charset=utf-8" {
			t.Errorf("list without the token: %d %q %q, want 401 %q", resp.StatusCode, resp.Header.Get("Content-Type"), b, want)
		}
	})
}
