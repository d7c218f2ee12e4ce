package daemon_test

import (
	"context"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/agentrunner/runner/wire"
)

// TestSinceStartsAtTime: since=T starts each stream at the first byte
// written at or after T, to the marks' granularity (wire.SinceGranularity:
// T at least that long after an earlier write never includes it), on the
// plain stream (running and ended forms) and on attach.
func TestSinceStartsAtTime(t *testing.T) {
	a := startDaemon(t)
	a.createSandbox("box")
	before := time.Now().Add(-time.Minute)
	s := a.spawn("box", wire.CreateSession{Argv: []string{"sh", "-c", "printf a; sleep 2.5; printf b; sleep 2.5; printf c; sleep 60"}})
	path := "/v1/sandboxes/box/sessions/" + s.ID
	waitLen := func(n int64) time.Time {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			var got wire.Session
			a.must("GET", path, nil, 200, &got)
			if got.Lengths["stdout"] >= n {
				return time.Now()
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatalf("stdout never reached %d bytes", n)
		return time.Time{}
	}
	sawA := waitLen(1)
	// At least the granularity after "a" was written, before "b" is.
	afterA := sawA.Add(wire.SinceGranularity + 100*time.Millisecond)
	waitLen(3)
	afterC := time.Now().Add(wire.SinceGranularity + 100*time.Millisecond)
	time.Sleep(time.Until(afterC))

	q := func(tm time.Time) string { return url.QueryEscape(tm.UTC().Format(time.RFC3339Nano)) }
	checkStream := func(form string) {
		t.Helper()
		for _, tc := range []struct {
			since time.Time
			want  string
		}{{before, "abc"}, {afterA, "bc"}, {afterC, ""}} {
			r := a.do("GET", path+"/streams/stdout?since="+q(tc.since), nil)
			if r.status != 200 || string(r.body) != tc.want {
				t.Errorf("%s: since %v: got %d %q, want %q", form, tc.since, r.status, r.body, tc.want)
			}
			if got, want := r.header.Get(wire.HeaderStreamStart), strconv.Itoa(3-len(tc.want)); got != want {
				t.Errorf("%s: since %v: %s %q, want %q", form, tc.since, wire.HeaderStreamStart, got, want)
			}
		}
	}
	checkStream("running")
	a.must("POST", path+"/terminate", `{"grace_ms":1000}`, 200, nil)
	checkStream("ended")
	for _, tc := range []struct {
		since time.Time
		want  string
	}{{before, "abc"}, {afterA, "bc"}, {afterC, ""}} {
		res := a.attach(context.Background(), "box", s.ID, "since="+q(tc.since), nil)
		if string(res.streams["stdout"]) != tc.want || res.terminal == nil {
			t.Errorf("attach since %v: got %q (terminal %v), want %q", tc.since, res.streams["stdout"], res.terminal != nil, tc.want)
		}
	}
	a.wantError(a.do("GET", path+"/streams/stdout?since=yesterday", nil), 400, wire.CodeInvalid)
	a.wantError(a.do("GET", path+"/streams/stdout?cursor=0&since="+q(before), nil), 400, wire.CodeInvalid)
}
