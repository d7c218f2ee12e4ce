package pod

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/seccomp"
)

// TestPodSeccompBytes: a pod given the launcher's compiled filter
// (Config.Seccomp) runs its holder under it (Seccomp: 2, no_new_privs);
// bytes that are not an intact program are ErrInvalid and start
// nothing: the holder never runs unfiltered.
func TestPodSeccompBytes(t *testing.T) {
	f, err := seccomp.Default()
	if err != nil {
		t.Fatal(err)
	}
	b, err := f.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	cfg := newConfig(t, "filter", 27)
	cfg.Seccomp = b
	p := create(t, cfg)
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.PID()))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"\nNoNewPrivs:\t1\n", "\nSeccomp:\t2\n"} {
		if !strings.Contains(string(st), want) {
			t.Errorf("the holder's status lacks %q:\n%s", want, st)
		}
	}
	for name, bad := range map[string][]byte{"cut short": b[:len(b)-1], "altered": append(append([]byte(nil), b[:40]...), append([]byte{b[40] ^ 1}, b[41:]...)...),
		"empty but not nil": {}} {
		t.Run(name, func(t *testing.T) {
			c := newConfig(t, "filter-bad", 28)
			c.Seccomp = bad
			if p, err := Create(ctxT(t, 10*time.Second), c); !errors.Is(err, ErrInvalid) {
				if p != nil {
					p.Destroy(ctxT(t, 10*time.Second))
				}
				t.Errorf("got %v, want ErrInvalid", err)
			}
		})
	}
}
