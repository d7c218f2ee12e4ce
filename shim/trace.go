package shim

import (
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Start tracing: with TraceEnv set in the shim's environment (runnerd's,
// which shims inherit) to an absolute file name, every shim appends one
// JSON line per step of its command's start to that file, for combining
// with runnerd's own spans of the same spawn (by session id and wall-clock
// time):
//
//	{"session":"ID","pid":SHIMPID,"src":"shim","span":"helper fork","start_unix_ns":N,"dur_ns":D}
//
// src is "shim" for the shim's own steps (the plan, the helper's fork or
// the direct fork/exec, the pod join, waiting for the helper's report,
// the whole start up to the exec ack) and "helper" for the nsexec helper's
// steps (reading its plan once its runtime is up, then each step of
// execSteps or podSteps by name: cgroups, mounts, binds, user switch,
// no_new_privs, the seccomp filter, ...), which the helper measures and
// reports on its socket ("span START_NS END_NS NAME" lines before its
// "exec" or error line) and the shim writes out. Times are wall clock
// (CLOCK_REALTIME, Unix nanoseconds) so spans of different processes line
// up; durations are as measured.
//
// The file is the operator's: opened by the shim (root) with O_APPEND,
// O_CREAT (0600) and O_NOFOLLOW, never by the helper (which may already
// be inside a pod's mount namespace). One write per line: lines of
// concurrent shims do not interleave. Spans carry step names and ids,
// never a command's argv or environment. Off (the default) it costs one
// atomic load per span site.
const TraceEnv = "RUNNER_SHIM_TRACE"

// traceFile is the trace file, opened on first use; nil: tracing is off
// (or the file could not be opened: said once on stderr, the shim's log).
var traceFile = sync.OnceValue(func() *os.File {
	name := os.Getenv(TraceEnv)
	if name == "" {
		return nil
	}
	if !strings.HasPrefix(name, "/") {
		os.Stderr.WriteString("shim: " + TraceEnv + " is not an absolute path; not tracing\n")
		return nil
	}
	fd, err := unix.Open(name, unix.O_WRONLY|unix.O_APPEND|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		os.Stderr.WriteString("shim: open trace " + name + ": " + err.Error() + "\n")
		return nil
	}
	return os.NewFile(uintptr(fd), name)
})

// traceSession is the session id spans are written with (set once the
// spec is known).
var traceSession atomic.Pointer[string]

// tracing reports whether spans are written.
func tracing() bool { return traceFile() != nil }

// traceSpan writes the span name of src that started at start and lasted
// until end.
func traceSpan(src, name string, start, end time.Time) {
	f := traceFile()
	if f == nil {
		return
	}
	var id string
	if p := traceSession.Load(); p != nil {
		id = *p
	}
	b, _ := json.Marshal(struct {
		Session string `json:"session"`
		PID     int    `json:"pid"`
		Src     string `json:"src"`
		Span    string `json:"span"`
		Start   int64  `json:"start_unix_ns"`
		Dur     int64  `json:"dur_ns"`
	}{id, os.Getpid(), src, name, start.UnixNano(), end.Sub(start).Nanoseconds()})
	f.Write(append(b, '\n'))
}

// span is traceSpan of the shim's own step name from start until now;
// nothing when tracing is off.
func span(name string, start time.Time) {
	if tracing() {
		traceSpan("shim", name, start, time.Now())
	}
}

// spanStart is time.Now when tracing, else the zero time (no clock read
// on the untraced path).
func spanStart() time.Time {
	if tracing() {
		return time.Now()
	}
	return time.Time{}
}

// helperSpans is what the helper measured of its steps (plan.Trace), sent
// to the shim before its "exec" or error line.
type helperSpans []string

// add records step name from start until now (nothing past
// maxHelperSpanBytes).
func (h *helperSpans) add(name string, start time.Time) {
	n := 0
	for _, l := range *h {
		n += len(l)
	}
	if n > maxHelperSpanBytes-128 {
		return
	}
	*h = append(*h, "span "+strconv.FormatInt(start.UnixNano(), 10)+" "+
		strconv.FormatInt(time.Now().UnixNano(), 10)+" "+name+"\n")
}

// write sends the spans on the report socket f, in one write.
func (h helperSpans) write(f *os.File) {
	if len(h) > 0 {
		f.WriteString(strings.Join(h, ""))
	}
}

// maxHelperSpanBytes bounds the spans a helper reports, so that they and
// the report line after them fit the report's 4096 bytes.
const maxHelperSpanBytes = 3072

// takeHelperSpans removes the helper's span lines from the front of its
// report rep and writes them to the trace; the rest is the report.
func takeHelperSpans(rep string) string {
	for {
		line, rest, ok := strings.Cut(rep, "\n")
		if !ok || !strings.HasPrefix(line, "span ") {
			return rep
		}
		rep = rest
		f := strings.SplitN(line, " ", 4) // span START END NAME
		if len(f) != 4 {
			continue
		}
		start, err1 := strconv.ParseInt(f[1], 10, 64)
		end, err2 := strconv.ParseInt(f[2], 10, 64)
		if err1 == nil && err2 == nil {
			traceSpan("helper", f[3], time.Unix(0, start), time.Unix(0, end))
		}
	}
}
