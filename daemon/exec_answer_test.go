package daemon_test

import (
	"encoding/json"
	"testing"

	"github.com/agentrunner/runner/wire"
)

// TestExecAnswerAlwaysHasFlags: stdout_truncated, stderr_truncated and
// timed_out are sent false too, as the protocol's example shows, so a
// client in another language never has to default a missing field.
func TestExecAnswerAlwaysHasFlags(t *testing.T) {
	a := startDaemon(t)
	a.createSandbox("box")
	r := a.do("POST", "/v1/sandboxes/box/exec", wire.Exec{ID: "e1", Argv: []string{"true"}})
	if r.status != 200 {
		t.Fatalf("exec: got %d %s, want 200", r.status, r.body)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(r.body, &fields); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"stdout_truncated", "stderr_truncated", "timed_out"} {
		if got := string(fields[k]); got != "false" {
			t.Errorf("%s: got %q, want false (body %s)", k, got, r.body)
		}
	}
	for _, k := range []string{"session", "stdout", "stderr", "exit"} {
		if _, ok := fields[k]; !ok {
			t.Errorf("%s missing (body %s)", k, r.body)
		}
	}
}
