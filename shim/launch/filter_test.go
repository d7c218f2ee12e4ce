package launch

import (
	"bytes"
	"testing"

	"github.com/agentrunner/runner/seccomp"
	"github.com/agentrunner/runner/shim/sessiondir"
)

// TestWithFilter: an Isolate or Pod spec gets this process's one compile
// of the filter, byte-identical to a fresh one, replacing whatever
// program it carried (an older runnerd's must not come back); any other
// spec gets none.
func TestWithFilter(t *testing.T) {
	f, err := seccomp.Default()
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := f.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		spec sessiondir.Spec
		want []byte
	}{
		{"isolate", sessiondir.Spec{Isolate: true}, fresh},
		{"pod", sessiondir.Spec{Pod: &sessiondir.PodRef{PID: 1}}, fresh},
		{"isolate with a stale program", sessiondir.Spec{Isolate: true, Seccomp: []byte("old")}, fresh},
		{"plain", sessiondir.Spec{}, nil},
		{"plain with a program", sessiondir.Spec{Seccomp: fresh}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := withFilter(tc.spec)
			if err != nil || !bytes.Equal(got.Seccomp, tc.want) || (tc.want == nil) != (got.Seccomp == nil) {
				t.Fatalf("got %d bytes (%v), want %d", len(got.Seccomp), err, len(tc.want))
			}
		})
	}
	a, _ := withFilter(sessiondir.Spec{Isolate: true})
	b, _ := withFilter(sessiondir.Spec{Isolate: true})
	if &a.Seccomp[0] != &b.Seccomp[0] {
		t.Error("compiled twice in one process")
	}
}
