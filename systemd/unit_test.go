// Package systemd_test checks systemd/runnerd.service, the unit
// images/install.sh installs: that systemd accepts every line of it, and
// that the properties decided for runnerd (docs/operations.md) stay.
package systemd_test

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// service returns the [Service] section's settings, each key with its
// values in order (a key may repeat).
func service(t *testing.T) map[string][]string {
	t.Helper()
	f, err := os.Open("runnerd.service")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	kv := map[string][]string{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "["):
			section = line
		case section == "[Service]":
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				t.Fatalf("line %q is not KEY=VALUE", line)
			}
			kv[k] = append(kv[k], v)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return kv
}

// TestUnitDecisions: each property compared with containerd.service and
// decided (the unit's comments say why) holds exactly that value.
func TestUnitDecisions(t *testing.T) {
	kv := service(t)
	for _, c := range []struct{ key, want string }{
		{"Restart", "always"},
		{"KillMode", "process"},
		{"Delegate", "yes"},
		{"LimitNPROC", "infinity"},
		{"LimitCORE", "0:infinity"},
		{"LimitNOFILE", "1048576"},
		{"TasksMax", "80%"},
		{"OOMPolicy", "continue"},
		{"Type", "notify"},
		{"EnvironmentFile", "-/etc/runnerd/runnerd.env"},
		{"ExecStart", "/usr/local/bin/runnerd --shim /usr/local/bin/runner-shim $RUNNERD_ARGS"},
	} {
		if got := kv[c.key]; len(got) != 1 || got[0] != c.want {
			t.Errorf("%s = %q, want exactly %q", c.key, got, c.want)
		}
	}
	// Inherited by every shim and command: protecting runnerd from the
	// OOM killer would protect the agents' commands too.
	if got, ok := kv["OOMScoreAdjust"]; ok {
		t.Errorf("OOMScoreAdjust = %q, want unset", got)
	}
}

// TestUnitVerifies runs systemd-analyze verify over the unit with its
// binaries pointed at an executable that exists: any line systemd does not
// understand (a misspelt key, a bad value) fails the test.
func TestUnitVerifies(t *testing.T) {
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("needs systemd-analyze")
	}
	unit, err := os.ReadFile("runnerd.service")
	if err != nil {
		t.Fatal(err)
	}
	truePath, err := exec.LookPath("true")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.NewReplacer("/usr/local/bin/runnerd", truePath, "/usr/local/bin/runner-shim", truePath).Replace(string(unit))
	path := filepath.Join(t.TempDir(), "runnerd.service")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(sa, "verify", path).CombinedOutput()
	if err != nil || len(out) != 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}
