package daemon

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestClaimSeesSharedV1Hierarchies: two runnerds in different memory
// cgroups but the same pids, cpu, cpuacct and freezer cgroups (the
// hybrid v1 layout of a host whose sessions each get a memory cgroup)
// resolve the default root to different memory paths and the same
// /runner in the other hierarchies. Their sandboxes of the same name
// shared session cgroups there, and one runnerd's removal of its
// session's cgroup SIGKILLed the other's command (bench's fan-out exit
// after 450560 of 4194304 bytes). The second must refuse to start,
// naming a shared root; with every hierarchy apart it starts.
func TestClaimSeesSharedV1Hierarchies(t *testing.T) {
	defer func(f string) { ownCgroupFile = f }(ownCgroupFile)
	own := func(mem, rest string) string {
		p := filepath.Join(t.TempDir(), "cgroup")
		b := "9:name=systemd:/\n8:pids:" + rest + "\n6:freezer:" + rest + "\n4:memory:" + mem + "\n2:cpuacct:" + rest + "\n1:cpu:" + rest + "\n0::/\n"
		if err := os.WriteFile(p, []byte(b), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name      string
		memB, rsB string
		refused   bool
	}{
		{"memory apart, pids cpu freezer shared", "/process_api/b", "/", true},
		{"every hierarchy apart", "/process_api/b", "/other", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			claims := t.TempDir()
			ownCgroupFile = own("/process_api/a", "/")
			a, err := claimHost(&Config{StateDir: t.TempDir(), ClaimDir: claims, NetPolicy: NetPolicyOff}, false)
			if err != nil {
				t.Fatalf("first claim: %v", err)
			}
			defer a.release()
			ownCgroupFile = own(tt.memB, tt.rsB)
			b, err := claimHost(&Config{StateDir: t.TempDir(), ClaimDir: claims, NetPolicy: NetPolicyOff}, false)
			b.release()
			switch {
			case tt.refused && !errors.Is(err, errClaimed):
				t.Fatalf("second claim: got %v, want errClaimed", err)
			case tt.refused && !strings.Contains(err.Error(), "cgroup root pids:/runner is used by runnerd pid "):
				t.Errorf("second claim's refusal does not name the shared pids root: %v", err)
			case !tt.refused && err != nil:
				t.Fatalf("second claim: got %v, want nil", err)
			}
		})
	}
}
