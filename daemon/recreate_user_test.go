package daemon_test

import (
	"testing"

	"github.com/agentrunner/runner/wire"
)

// TestRecreateWithoutUser: a create by name alone returns a sandbox made
// with a user as it is, like one made with a network; naming another user
// is still a conflict.
func TestRecreateWithoutUser(t *testing.T) {
	a := startDaemon(t)
	var first, again wire.Sandbox
	a.must("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "box", User: "nobody"}, 200, &first)
	a.must("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "box"}, 200, &again)
	if again.Incarnation != first.Incarnation || again.User != "nobody" {
		t.Fatalf("re-create by name: got %+v, want the sandbox as it is (%+v)", again, first)
	}
	r := a.do("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "box", User: "daemon"})
	a.wantError(r, 409, wire.CodeInvalid)
}
