package daemon_test

import (
	"testing"
	"time"

	"github.com/agentrunner/runner/wire"
)

// TestMarksSayWhenBytesWereWritten: GET .../marks lists a stream's
// offset-time marks, one per write at least the granularity apart, each
// time no earlier than the spawn (or the previous mark plus the
// granularity) and no later than the test saw that write's bytes; from=N starts at the mark covering byte N; the same marks are
// served while the command runs and after it ended; a bad stream or from
// is 400 invalid.
func TestMarksSayWhenBytesWereWritten(t *testing.T) {
	a := startDaemon(t)
	a.createSandbox("box")
	beforeSpawn := time.Now()
	s := a.spawn("box", wire.CreateSession{Argv: []string{"sh", "-c", "printf 'a\\n'; sleep 1.5; printf 'b\\n'; sleep 1.5; printf 'c\\n'; sleep 60"}})
	path := "/v1/sandboxes/box/sessions/" + s.ID
	// seen[i] is when the test saw line i's bytes: its mark is no later.
	// (A length that is not there yet says nothing: session lengths may
	// lag the journal, so the lower bound is the spawn for line 0 and, for
	// the others, the granularity after the previous mark.)
	var seen [3]time.Time
	for i := range seen {
		deadline := time.Now().Add(20 * time.Second)
		for {
			var got wire.Session
			a.must("GET", path, nil, 200, &got)
			if got.Lengths["stdout"] >= int64(2*(i+1)) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("stdout never reached %d bytes", 2*(i+1))
			}
			time.Sleep(20 * time.Millisecond)
		}
		seen[i] = time.Now()
	}
	check := func(form string) {
		t.Helper()
		for _, tc := range []struct {
			from string
			want []int64 // offsets; the lines are 2 bytes each
		}{{"", []int64{0, 2, 4}}, {"0", []int64{0, 2, 4}}, {"1", []int64{0, 2, 4}}, {"3", []int64{2, 4}}, {"4", []int64{4}}, {"99", []int64{4}}} {
			var m wire.Marks
			q := "?stream=stdout"
			if tc.from != "" {
				q += "&from=" + tc.from
			}
			a.must("GET", path+"/marks"+q, nil, 200, &m)
			if m.Stream != "stdout" || m.Next != nil || m.GranularityMS != wire.SinceGranularity.Milliseconds() {
				t.Errorf("%s from %q: got stream %q next %v granularity %d, want stdout, none, %d", form, tc.from, m.Stream, m.Next, m.GranularityMS, wire.SinceGranularity.Milliseconds())
			}
			if len(m.Marks) != len(tc.want) {
				t.Fatalf("%s from %q: got %d marks %+v, want offsets %v", form, tc.from, len(m.Marks), m.Marks, tc.want)
			}
			for i, mk := range m.Marks {
				line := int(tc.want[i] / 2)
				if mk.Offset != tc.want[i] {
					t.Errorf("%s from %q: mark %d offset %d, want %d", form, tc.from, i, mk.Offset, tc.want[i])
				}
				lo := beforeSpawn
				if i > 0 {
					lo = m.Marks[i-1].Time.Add(wire.SinceGranularity)
				}
				if mk.Time.Before(lo) || mk.Time.After(seen[line]) {
					t.Errorf("%s from %q: mark %d time %v, want within [%v, %v]", form, tc.from, i, mk.Time, lo, seen[line])
				}
			}
		}
		var m wire.Marks
		a.must("GET", path+"/marks?stream=stderr", nil, 200, &m)
		if len(m.Marks) != 0 {
			t.Errorf("%s: stderr, never written: got marks %+v, want none", form, m.Marks)
		}
		a.wantError(a.do("GET", path+"/marks?stream=stdin", nil), 400, wire.CodeInvalid)
		a.wantError(a.do("GET", path+"/marks", nil), 400, wire.CodeInvalid)
		a.wantError(a.do("GET", path+"/marks?stream=stdout&from=-1", nil), 400, wire.CodeInvalid)
	}
	check("running")
	a.must("POST", path+"/terminate", `{"grace_ms":1000}`, 200, nil)
	check("ended")
	a.wantError(a.do("GET", "/v1/sandboxes/box/sessions/nosuch/marks?stream=stdout", nil), 404, wire.CodeNotFound)
}
