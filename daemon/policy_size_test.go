package daemon_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/agentrunner/runner/netpolicy"
	"github.com/agentrunner/runner/wire"
)

// TestPolicyTooLargeRefusedBeforeActing: a policy of 20,000 entries is
// 400 invalid stating the maximum, at create and at update, before
// anything changes: the update leaves the old policy recorded (and
// enforced: netpolicy's TestPolicyAtMaxEntriesEnforced), the create
// leaves no sandbox. Before, the update answered 503, the sandbox denied
// everything and GET showed the 20,000 entries as enforced.
func TestPolicyTooLargeRefusedBeforeActing(t *testing.T) {
	a := startNetDaemon(t, passableTempDir(t), testLogger(t))
	a.must("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "boxed", Network: &wire.Network{Allow: []string{"allowed.test"}}}, 200, nil)
	big := make([]string, 20000)
	for i := range big {
		big[i] = fmt.Sprintf("h%d.example.test", i)
	}
	want := fmt.Sprint(netpolicy.MaxEntries)
	r := a.do("PUT", "/v1/sandboxes/boxed/network", wire.Network{Allow: big})
	a.wantError(r, 400, wire.CodeInvalid)
	if d := r.errBody(t).Detail; !strings.Contains(d, want) {
		t.Errorf("update: detail %q does not state the maximum %s", d, want)
	}
	var sb wire.Sandbox
	a.must("GET", "/v1/sandboxes/boxed", nil, 200, &sb)
	if sb.Network == nil || !slices.Equal(sb.Network.Allow, []string{"allowed.test"}) {
		t.Errorf("after a refused update GET shows %+v, want the old [allowed.test]", sb.Network)
	}
	r = a.do("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "huge", Network: &wire.Network{Allow: big}})
	a.wantError(r, 400, wire.CodeInvalid)
	if d := r.errBody(t).Detail; !strings.Contains(d, want) {
		t.Errorf("create: detail %q does not state the maximum %s", d, want)
	}
	if r := a.do("GET", "/v1/sandboxes/huge", nil); r.status != 404 {
		t.Errorf("a refused create left a sandbox: %d %s", r.status, r.body)
	}
	// The maximum itself is taken.
	a.putNetwork("boxed", big[:netpolicy.MaxEntries]...)
}
