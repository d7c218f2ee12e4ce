package stream_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/stream"
	"github.com/agentrunner/runner/wire"
)

// TestErrorTable walks every code of wire.ErrorTable through every
// mapping, both directions, and fails when a code, a kind or a status is
// added on one side without its row.
func TestErrorTable(t *testing.T) {
	inTable := map[wire.Code]bool{}
	exits := map[int]wire.Code{}
	for _, row := range wire.ErrorTable {
		c := row.Code
		if inTable[c] {
			t.Errorf("code %s has two rows", c)
		}
		inTable[c] = true

		// code -> kind -> code
		k, ok := stream.Kind(c)
		if !ok {
			t.Errorf("code %s has no adapter kind", c)
			continue
		}
		if back, ok := stream.Code(k); !ok || back != c {
			t.Errorf("Code(Kind(%s)) = %s, %v; want %s", c, back, ok, c)
		}
		// kind -> Go error -> kind, and transience
		err, ok := stream.KindError("runner", &wire.Error{Code: c, Detail: "d", RetryAfterMS: 1500}, "d")
		if !ok {
			t.Errorf("KindError(%s) has no error", c)
			continue
		}
		if got := adapter.KindOf(err); got != k {
			t.Errorf("KindOf(KindError(%s)) = %s, want %s", c, got, k)
		}
		if got := adapter.Transient(err); got != row.Transient {
			t.Errorf("Transient(KindError(%s)) = %v, the table says %v", c, got, row.Transient)
		}
		// code -> HTTP status
		if (row.Status == 0) != (len(row.Statuses) == 0) || (row.Status != 0 && row.Statuses[0] != row.Status) {
			t.Errorf("%s: Status %d and Statuses %v disagree", c, row.Status, row.Statuses)
		}
		if row.Status == 0 && c.Known() {
			t.Errorf("%s is an error response code (in wire.Codes) without an HTTP status", c)
		}
		if row.Status != 0 && !c.Known() {
			t.Errorf("%s has HTTP status %d but is not in wire.Codes", c, row.Status)
		}
		if row.Status != 0 && c.Status() != row.Status {
			t.Errorf("%s.Status() = %d, want %d", c, c.Status(), row.Status)
		}
		// code -> exit statuses: one per kind, but for the shared
		// "other" status of the kinds a user cannot act on differently.
		if row.Exit < 128 || row.Exit > 255 {
			t.Errorf("%s: CLI exit %d outside the range runner keeps for itself", c, row.Exit)
		}
		if prev, dup := exits[row.Exit]; dup && row.Exit != wire.RunnerExitOther {
			t.Errorf("%s and %s share CLI exit %d", prev, c, row.Exit)
		}
		exits[row.Exit] = c
		if row.ShimExit == wire.ShimExitOK || row.ShimExit == wire.ShimExitUsage {
			t.Errorf("%s: runner-shim exit %d is success or usage", c, row.ShimExit)
		}
	}
	// Every code an answer can carry has a row ...
	for _, c := range wire.Codes {
		if !inTable[c] {
			t.Errorf("wire code %s has no row in wire.ErrorTable", c)
		}
	}
	// ... and every kind of the taxonomy has one (kind -> code).
	for _, k := range adapter.Kinds() {
		c, ok := stream.Code(k)
		if !ok || !inTable[c] {
			t.Errorf("adapter kind %s has no row in wire.ErrorTable", k)
		}
	}
	for _, k := range []adapter.Kind{adapter.KindNone, adapter.KindContext} {
		if c, ok := stream.Code(k); ok {
			t.Errorf("Code(%q) = %s; no wire answer carries it", k, c)
		}
	}
	if _, ok := stream.Kind("from_the_future"); ok {
		t.Error("Kind of an unknown code is ok")
	}
}

// TestKindErrorDetail: the typed kinds carry detail, retry delay and
// uncertainty; an older daemon's "uncertain:" prefix counts.
func TestKindErrorDetail(t *testing.T) {
	err, _ := stream.KindError("runner", &wire.Error{Code: wire.CodeRateLimited, RetryAfterMS: 1500}, "d")
	var rl *adapter.RateLimitedError
	if !errors.As(err, &rl) || rl.RetryAfter != 1500*time.Millisecond {
		t.Errorf("rate_limited = %v, want RetryAfter 1.5s", err)
	}
	for _, tc := range []struct {
		we   wire.Error
		want bool
	}{
		{wire.Error{Code: wire.CodeUnavailable, Detail: "x", Uncertain: true}, true},
		{wire.Error{Code: wire.CodeUnavailable, Detail: "uncertain: x"}, true},
		{wire.Error{Code: wire.CodeUnavailable, Detail: "uncertainty"}, false},
		{wire.Error{Code: wire.CodeUnavailable, Detail: "x"}, false},
	} {
		err, _ := stream.KindError("runner", &tc.we, tc.we.Detail)
		var ue *adapter.UnavailableError
		if !errors.As(err, &ue) || ue.Uncertain != tc.want || ue.Detail != tc.we.Detail {
			t.Errorf("KindError(%+v) = %#v, want Uncertain %v", tc.we, err, tc.want)
		}
	}
	err, _ = stream.KindError("e2b", &wire.Error{Code: wire.CodeProvider}, "d")
	var pe *adapter.ProviderError
	if !errors.As(err, &pe) || pe.Provider != "e2b" || pe.Detail != "d" {
		t.Errorf("provider = %#v, want Provider e2b, Detail d", err)
	}
}

// TestFrameError: inside a stream not_found is never definitive and an
// unknown code is unavailable; every other code is its own kind.
func TestFrameError(t *testing.T) {
	for _, c := range append(append([]wire.Code{}, wire.Codes...), "from_the_future") {
		err := stream.FrameError("runner", "session s1", &wire.Error{Code: c, Detail: "d"})
		want := adapter.Kind(c)
		if c == wire.CodeNotFound || c == "from_the_future" {
			want = adapter.KindUnavailable
		}
		if got := adapter.KindOf(err); got != want {
			t.Errorf("FrameError(%s) = %v (kind %s), want %s", c, err, got, want)
		}
		if c == wire.CodeRateLimited {
			continue // *adapter.RateLimitedError carries only its delay
		}
		if want := "session s1: " + string(c) + ": d"; !strings.Contains(err.Error(), want) {
			t.Errorf("FrameError(%s) = %q, want it to name %q", c, err, want)
		}
	}
}
