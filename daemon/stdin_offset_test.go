package daemon_test

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/internal/ostest"
	"github.com/agentrunner/runner/wire"
)

// stdinAt is POST .../stdin with the Runner-Stdin-Offset header.
func (a *api) stdinAt(sandbox, id string, off int64, p []byte) response {
	a.t.Helper()
	req, err := http.NewRequest("POST", a.base+"/v1/sandboxes/"+sandbox+"/sessions/"+id+"/stdin", bytes.NewReader(p))
	if err != nil {
		a.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	req.Header.Set(wire.HeaderStdinOffset, strconv.FormatInt(off, 10))
	resp, err := a.hc.Do(req)
	if err != nil {
		a.t.Fatalf("stdin write at %d: %v", off, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: raw}
}

// stdinCount is the session's stdin count: an empty write at 0.
func (a *api) stdinCount(sandbox, id string) int64 {
	a.t.Helper()
	r := a.stdinAt(sandbox, id, 0, nil)
	n, err := strconv.ParseInt(r.header.Get(wire.HeaderStdinOffset), 10, 64)
	if r.status != http.StatusNoContent || err != nil {
		a.t.Fatalf("stdin count: %d %q %s", r.status, r.header.Get(wire.HeaderStdinOffset), r.body)
	}
	return n
}

// pipeHolds is how many bytes wait in the stdin pipe of process pid.
var pipeHolds = ostest.PipeHolds

// cutStdinWrite sends a stdin write at off on a connection of its own
// and closes it without reading the answer: after sending all but the
// last byte of p (cut mid-body), or after all of p once runnerd is
// writing it to command pid, which does not read (cut mid-write: the
// pipe holds more than before).
func (a *api) cutStdinWrite(sandbox, id string, pid int, off int64, p []byte, midBody bool) {
	a.t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(a.base, "http://"))
	if err != nil {
		a.t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /v1/sandboxes/%s/sessions/%s/stdin HTTP/1.1\r\nHost: runnerd\r\nAuthorization: Bearer %s\r\n%s: %d\r\nContent-Length: %d\r\n\r\n",
		sandbox, id, a.token, wire.HeaderStdinOffset, off, len(p))
	if midBody {
		c.Write(p[:len(p)-1])
		time.Sleep(200 * time.Millisecond)
		return
	}
	before := pipeHolds(a.t, pid)
	c.Write(p)
	for deadline := time.Now().Add(20 * time.Second); pipeHolds(a.t, pid) == before; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			a.t.Fatal("runnerd wrote nothing of the write into the command's stdin")
		}
	}
	time.Sleep(100 * time.Millisecond) // the pipe is full: the write waits
}

// TestStdinOffsetExactlyOnce: stdin writes carrying Runner-Stdin-Offset
// whose connections are cut (mid-body: nothing delivered; mid-write:
// a prefix delivered) and which are then sent again with the same offset
// reach the command exactly once, in order: cat copies back exactly
// the bytes sent. A write at an offset past the count (a gap) is 409
// invalid naming both numbers and writes nothing; a malformed offset is
// 400 invalid. A plain write (no offset) still answers without the
// header.
func TestStdinOffsetExactlyOnce(t *testing.T) {
	a := startDaemon(t)
	a.createSandbox("box")
	// cat starts reading only once the file "go" exists: until then the
	// pipe fills and a write waits inside runnerd.
	s := a.spawn("box", wire.CreateSession{ID: "cat", Argv: []string{"sh", "-c", "while [ ! -e go ]; do sleep 0.05; done; exec cat"}})

	if n := a.stdinCount("box", s.ID); n != 0 {
		t.Fatalf("stdin count of a new session: %d, want 0", n)
	}
	head := []byte("head\n")
	if r := a.stdinAt("box", s.ID, 0, head); r.status != http.StatusNoContent || r.header.Get(wire.HeaderStdinOffset) != "5" {
		t.Fatalf("write at 0: %d %s=%q %s, want 204 with 5", r.status, wire.HeaderStdinOffset, r.header.Get(wire.HeaderStdinOffset), r.body)
	}
	if r := a.stdinAt("box", s.ID, 0, head); r.status != http.StatusNoContent || r.header.Get(wire.HeaderStdinOffset) != "5" {
		t.Fatalf("the same write again at 0: %d %q %s, want 204 with 5 (nothing written)", r.status, r.header.Get(wire.HeaderStdinOffset), r.body)
	}
	r := a.stdinAt("box", s.ID, 9, []byte("gap"))
	a.wantError(r, http.StatusConflict, wire.CodeInvalid)
	if d := r.errBody(t).Detail; !strings.Contains(d, "9") || !strings.Contains(d, "5") {
		t.Fatalf("gap detail %q: want both 9 and 5", d)
	}
	req, _ := http.NewRequest("POST", a.base+"/v1/sandboxes/box/sessions/"+s.ID+"/stdin", strings.NewReader("x"))
	req.Header.Set("Authorization", "Bearer "+a.token)
	req.Header.Set(wire.HeaderStdinOffset, "-1")
	if resp, err := a.hc.Do(req); err != nil || resp.StatusCode != http.StatusBadRequest || resp.Header.Get(wire.HeaderError) != string(wire.CodeInvalid) {
		t.Fatalf("offset -1: %v %v, want 400 invalid", resp, err)
	} else {
		resp.Body.Close()
	}

	// Cut mid-body: runnerd never wrote any of it.
	body1 := make([]byte, 100<<10)
	for i := range body1 {
		body1[i] = byte(rand.IntN(256))
	}
	a.cutStdinWrite("box", s.ID, s.PID, 5, body1, true)
	if n := a.stdinCount("box", s.ID); n != 5 {
		t.Fatalf("stdin count after a write cut mid-body: %d, want 5", n)
	}
	// Cut mid-write: the pipe (64 KiB) took a prefix.
	a.cutStdinWrite("box", s.ID, s.PID, 5, body1, false)
	cut := a.stdinCount("box", s.ID)
	if cut <= 5 || cut >= 5+int64(len(body1)) {
		t.Fatalf("stdin count after a write cut mid-write: %d, want a prefix of the %d bytes past 5", cut, len(body1))
	}
	t.Logf("the cut write delivered %d of %d bytes", cut-5, len(body1))

	// The command reads now; the resend with the same offset completes
	// the write, and a plain write follows it.
	a.exec("box", wire.Exec{Argv: []string{"touch", "go"}})
	want := append(append([]byte{}, head...), body1...)
	if r := a.stdinAt("box", s.ID, 5, body1); r.status != http.StatusNoContent || r.header.Get(wire.HeaderStdinOffset) != strconv.Itoa(len(want)) {
		t.Fatalf("resend at 5: %d %q %s, want 204 with %d", r.status, r.header.Get(wire.HeaderStdinOffset), r.body, len(want))
	}
	if r := a.do("POST", "/v1/sandboxes/box/sessions/"+s.ID+"/stdin", "tail\n"); r.status != http.StatusNoContent || r.header.Get(wire.HeaderStdinOffset) != "" {
		t.Fatalf("plain write: %d %q %s, want 204 without %s", r.status, r.header.Get(wire.HeaderStdinOffset), r.body, wire.HeaderStdinOffset)
	}
	want = append(want, "tail\n"...)
	a.must("POST", "/v1/sandboxes/box/sessions/"+s.ID+"/close-stdin", nil, http.StatusNoContent, nil)
	if e := a.waitEnded("box", s.ID); e.Exit == nil || e.Exit.Code != 0 {
		t.Fatalf("cat ended %+v, want exit 0", e.Exit)
	}
	got := a.do("GET", "/v1/sandboxes/box/sessions/"+s.ID+"/streams/stdout", nil).body
	if !bytes.Equal(got, want) {
		n := 0
		for n < len(got) && n < len(want) && got[n] == want[n] {
			n++
		}
		t.Fatalf("cat copied %d bytes, want %d (each byte once; equal prefix %d; the cut delivered %d)", len(got), len(want), n, cut-5)
	}
}
