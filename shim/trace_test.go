package shim

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/pod"
	"github.com/agentrunner/runner/shim/internal/shimtest"
	"github.com/agentrunner/runner/shim/sessiondir"
)

type traceLine struct {
	Session string `json:"session"`
	PID     int    `json:"pid"`
	Src     string `json:"src"`
	Span    string `json:"span"`
	Start   int64  `json:"start_unix_ns"`
	Dur     int64  `json:"dur_ns"`
}

// readTrace returns the spans of session id in the trace file name.
func readTrace(t *testing.T, name, id string) []traceLine {
	t.Helper()
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []traceLine
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var l traceLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("trace line %q: %v", sc.Text(), err)
		}
		if l.Session == id {
			out = append(out, l)
		}
	}
	return out
}

// TestTraceSpans: with TraceEnv set, a shim writes one span per step of
// its command's start, its own and its helper's, in wall-clock time
// within the start's window; the command's environment does not carry
// the variable (Spec.Env alone).
func TestTraceSpans(t *testing.T) {
	shimtest.NeedRoot(t)
	name := filepath.Join(t.TempDir(), "trace.jsonl")
	t.Setenv(TraceEnv, name)
	p := newPod(t, "trace", 15)
	env := []string{"PATH=/usr/bin:/bin"}
	for _, tc := range []struct {
		spec sessiondir.Spec
		want []string // src/span, in any order, at least these
	}{
		{sessiondir.Spec{ID: "direct", Argv: []string{"sh", "-c", "env"}, Env: env},
			[]string{"shim/plan", "shim/fork and exec (direct)", "shim/start (to exec ack)"}},
		{sessiondir.Spec{ID: "isolated", Argv: []string{"sh", "-c", "env"}, Env: env, User: "nobody", Isolate: true},
			[]string{"shim/plan", "shim/helper fork", "shim/helper plan to exec ack", "shim/start (to exec ack)",
				"helper/read plan", "helper/empty the capability bounding set", "helper/switch user",
				"helper/set no_new_privs", "helper/load the seccomp filter"}},
		{sessiondir.Spec{ID: "pod", Argv: []string{"sh", "-c", "env"}, Env: env, Pod: p.ref(), Dir: pod.WorkspacePath},
			[]string{"shim/plan", "shim/pod helper fork", "shim/pod join (constructor: setns, ids, fork)",
				"shim/pod helper plan to exec ack", "shim/start (to exec ack)",
				"helper/read plan", "helper/make a session", "helper/look up the command", "helper/load the seccomp filter"}},
	} {
		t.Run(tc.spec.ID, func(t *testing.T) {
			before := time.Now().UnixNano()
			dir, st := shimtest.Start(t, tc.spec)
			after := time.Now().UnixNano()
			if e := shimtest.WaitExit(t, dir); e.Code != 0 {
				t.Fatalf("exit %+v, want 0", e)
			}
			if out := shimtest.StdoutOf(t, dir); strings.Contains(out, TraceEnv) || !strings.Contains(out, "PATH=/usr/bin:/bin\n") {
				t.Errorf("command's environment: got %q, want its Spec.Env's PATH and no %s", out, TraceEnv)
			}
			var got []string
			for _, l := range readTrace(t, name, tc.spec.ID) {
				got = append(got, l.Src+"/"+l.Span)
				if l.PID != st.ShimPID || l.Dur < 0 || l.Start < before || l.Start+l.Dur > after {
					t.Errorf("span %+v: want shim pid %d, a duration >= 0, within [%d, %d]", l, st.ShimPID, before, after)
				}
			}
			for _, w := range tc.want {
				if !slices.Contains(got, w) {
					t.Errorf("no span %q; got %q", w, got)
				}
			}
		})
	}
}

// TestTraceOff: without TraceEnv no shim writes anything and the helper
// is not asked to measure.
func TestTraceOff(t *testing.T) {
	if tracing() {
		t.Skip(TraceEnv + " is set for this test process")
	}
	if r := takeHelperSpans("exec\n"); r != "exec\n" {
		t.Fatalf("report without spans: got %q", r)
	}
	if r := takeHelperSpans("span 1 2 load the seccomp filter\nexec\n"); r != "exec\n" {
		t.Fatalf("report with a span: got %q, want %q", r, "exec\n")
	}
	if err := parseNsexecReport("span 1 2 a\nspan 2 3 b c\nerror 2 setup nsexec: x\n"); err == nil || err.Error() != "nsexec: x: no such file or directory" {
		t.Fatalf("error report after spans: got %v", err)
	}
}
