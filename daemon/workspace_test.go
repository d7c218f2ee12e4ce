package daemon_test

import (
	"os"
	"os/user"
	"strconv"
	"syscall"
	"testing"

	"github.com/agentrunner/runner/wire"
)

// A workspace is the agent's memory and may hold its credentials: mode
// 0700, owned by the sandbox's run-as user, never readable by other local
// users (another sandbox's run-as user among them).
func TestWorkspacePrivate(t *testing.T) {
	a := startDaemon(t)
	for _, tc := range []struct {
		name, user string
	}{
		{"ws-root", ""},
		{"ws-nobody", "nobody"},
	} {
		if tc.user != "" && os.Geteuid() != 0 {
			t.Logf("not root: cannot create a sandbox for user %s", tc.user)
			continue
		}
		var sb wire.Sandbox
		body := `{"name":"` + tc.name + `"}`
		if tc.user != "" {
			body = `{"name":"` + tc.name + `","user":"` + tc.user + `"}`
		}
		a.must("POST", "/v1/sandboxes", body, 200, &sb)
		fi, err := os.Stat(sb.WorkspaceOnHost())
		if err != nil {
			t.Fatal(err)
		}
		if perm := fi.Mode().Perm(); perm != 0o700 {
			t.Errorf("%s: workspace mode %v, want 0700", tc.name, perm)
		}
		wantUID := os.Geteuid()
		if sb.UID != nil { // isolated (the default as root): its own identity
			wantUID = int(*sb.UID)
		} else if tc.user != "" {
			u, err := user.Lookup(tc.user)
			if err != nil {
				t.Fatal(err)
			}
			wantUID, _ = strconv.Atoi(u.Uid)
		}
		if uid := int(fi.Sys().(*syscall.Stat_t).Uid); uid != wantUID {
			t.Errorf("%s: workspace owned by uid %d, want %d", tc.name, uid, wantUID)
		}
	}
}
