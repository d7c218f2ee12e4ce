package hosted_test

import (
	"context"
	"errors"
	"testing"

	"github.com/agentrunner/runner/adapter"
)

// TestGuestChecksTheHandle: Guest is outside the portable type's
// methods, so it runs the portable handle check itself: a handle of
// another provider, or whose name would go into a provider's URL as a
// path, never reaches the driver's Open.
func TestGuestChecksTheHandle(t *testing.T) {
	d := newDriver(adapter.CapAttach)
	a := newAdapter(t, d)
	for _, h := range []adapter.Handle{
		{Provider: "other", Name: "box", ID: "id-1"},
		{Provider: "model", Name: "../box", ID: "id-1"},
	} {
		var inv *adapter.InvalidError
		if _, err := a.Guest(context.Background(), h); !errors.As(err, &inv) {
			t.Errorf("Guest(%v): got %v, want invalid", h, err)
		}
	}
	if d.opens != 0 {
		t.Errorf("the driver opened %d transports, want 0", d.opens)
	}
}
