package daemon_test

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentrunner/runner/daemon"
	"github.com/agentrunner/runner/wire"
)

// formListener is a loopback listener whose connections count the bytes
// net/http's ReadFrom hands them, by the form of the reader: file ranges
// (an *io.LimitedReader over an *os.File, what net.TCPConn sends with
// sendfile(2)) or anything else (copied through user space).
type formListener struct {
	net.Listener
	file, other atomic.Int64
}

func (l *formListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &formConn{TCPConn: c.(*net.TCPConn), l: l}, nil
}

type formConn struct {
	*net.TCPConn
	l *formListener
}

func (c *formConn) ReadFrom(r io.Reader) (int64, error) {
	n, err := c.TCPConn.ReadFrom(r)
	if lr, ok := r.(*io.LimitedReader); ok {
		if _, ok := lr.R.(*os.File); ok {
			c.l.file.Add(n)
			return n, err
		}
	}
	c.l.other.Add(n)
	return n, err
}

// getStream GETs a stream and reads its body whole.
func getStream(t *testing.T, a *api, path string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest("GET", a.base+path, nil)
	req.Header.Set("Authorization", "Bearer "+a.token)
	resp, err := a.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: read body: %v", path, err)
	}
	return resp, body
}

// TestStreamEndedForm checks a session that ended before the request is
// served with a Content-Length and its end in the headers, its bytes sent
// as file ranges (sendfile), while a running one keeps the chunked body
// and trailers.
func TestStreamEndedForm(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fl := &formListener{Listener: l}
	a := startDaemonCfg(t, daemon.Config{StateDir: t.TempDir(), Token: testToken, NetPolicy: daemon.NetPolicyOff, TCPListener: fl})
	a.createSandbox("box")
	sess := a.spawn("box", wire.CreateSession{Argv: []string{"sh", "-c", "seq 1 300000; exit 5"}})
	var want bytes.Buffer
	for i := 1; i <= 300000; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	res := a.attach(ctxFor(t, 30*time.Second), "box", sess.ID, "", nil)
	if res.terminal == nil || res.exit.Code != 5 {
		t.Fatalf("attach: terminal %v exit %+v, want exit 5", res.terminal, res.exit)
	}
	path := "/v1/sandboxes/box/sessions/" + sess.ID + "/streams/"
	for _, tc := range []struct {
		name, query string
		cursor      int
	}{
		{"from 0", "stdout", 0},
		{"from a cursor", "stdout?cursor=7", 7},
		{"follow", "stdout?cursor=100&follow=1", 100},
		{"at the end", "stdout?cursor=" + strconv.Itoa(want.Len()), want.Len()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file0 := fl.file.Load()
			other0 := fl.other.Load()
			resp, body := getStream(t, a, path+tc.query)
			n := int64(want.Len() - tc.cursor)
			if resp.StatusCode != 200 || resp.ContentLength != n || len(resp.TransferEncoding) != 0 {
				t.Fatalf("got %d, Content-Length %d, Transfer-Encoding %v; want 200, %d, none", resp.StatusCode, resp.ContentLength, resp.TransferEncoding, n)
			}
			if !bytes.Equal(body, want.Bytes()[tc.cursor:]) {
				t.Fatalf("body: got %d bytes, want %d (or content differs)", len(body), n)
			}
			if got := resp.Header.Get(wire.HeaderStreamEnd); got != "exit" {
				t.Errorf("header %s: got %q, want exit", wire.HeaderStreamEnd, got)
			}
			var exit wire.Exit
			if err := jsonUnmarshal([]byte(resp.Header.Get(wire.HeaderExit)), &exit); err != nil || exit.Code != 5 {
				t.Errorf("header %s %q: %v, want code 5", wire.HeaderExit, resp.Header.Get(wire.HeaderExit), err)
			}
			if len(resp.Trailer) != 0 {
				t.Errorf("trailers %v, want none", resp.Trailer)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/octet-stream" {
				t.Errorf("Content-Type %q", ct)
			}
			// net/http writes the first 512 bytes itself (its sniffing
			// window), then hands the rest to the connection.
			file, other := fl.file.Load()-file0, fl.other.Load()-other0
			if other != 0 || file < n-512 {
				t.Errorf("ReadFrom got %d bytes as file ranges and %d otherwise; want at least %d as file ranges and none otherwise", file, other, n-512)
			}
		})
	}
	// An empty stream of an ended session: an empty body, same headers.
	resp, body := getStream(t, a, path+"stderr")
	if resp.ContentLength != 0 || len(body) != 0 || resp.Header.Get(wire.HeaderStreamEnd) != "exit" {
		t.Errorf("empty stderr: Content-Length %d, %d bytes, end %q; want 0, 0, exit", resp.ContentLength, len(body), resp.Header.Get(wire.HeaderStreamEnd))
	}

	// A running session, with and without follow: chunked, trailers.
	run := a.spawn("box", wire.CreateSession{Argv: []string{"sh", "-c", "printf hi; exec sleep 30"}})
	a.attach(ctxFor(t, 10*time.Second), "box", run.ID, "", func(wire.Frame) bool { return true })
	resp, body = getStream(t, a, "/v1/sandboxes/box/sessions/"+run.ID+"/streams/stdout")
	if string(body) != "hi" || resp.ContentLength != -1 || resp.Header.Get(wire.HeaderStreamEnd) != "" || resp.Trailer.Get(wire.HeaderStreamEnd) != "more" {
		t.Errorf("running session: body %q, Content-Length %d, header end %q, trailer end %q; want \"hi\", -1, none, more",
			body, resp.ContentLength, resp.Header.Get(wire.HeaderStreamEnd), resp.Trailer.Get(wire.HeaderStreamEnd))
	}
}

// TestStreamEndedStalledClientDoesNotHoldStop: a replay to a client that
// stopped reading is cut when runnerd stops (its write deadline), instead
// of holding Shutdown for a whole sendfile slice, or until the forced
// close after ShutdownTimeout.
func TestStreamEndedStalledClientDoesNotHoldStop(t *testing.T) {
	a, stop := startDaemonStoppable(t, daemon.Config{StateDir: t.TempDir(), Token: testToken,
		NetPolicy: daemon.NetPolicyOff, ShutdownTimeout: 30 * time.Second})
	a.createSandbox("box")
	res := a.exec("box", wire.Exec{Argv: []string{"sh", "-c", "head -c 67108864 /dev/zero"}})
	if res.Exit.Code != 0 {
		t.Fatalf("exec: %+v", res.Exit)
	}
	// The exec's answer carries at most its output cap; the journal has all.
	var sess wire.SessionList
	a.must("GET", "/v1/sandboxes/box/sessions", nil, 200, &sess)
	req, _ := http.NewRequest("GET", a.base+"/v1/sandboxes/box/sessions/"+sess.Sessions[0].ID+"/streams/stdout", nil)
	req.Header.Set("Authorization", "Bearer "+a.token)
	resp, err := a.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.ContentLength != 64<<20 {
		t.Fatalf("Content-Length %d, want the ended form's %d", resp.ContentLength, 64<<20)
	}
	// Read a little, then stall: the socket buffers fill and the daemon's
	// sendfile blocks.
	if _, err := io.ReadFull(resp.Body, make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	t0 := time.Now()
	stop()
	if d := time.Since(t0); d > 5*time.Second {
		t.Errorf("stop took %v with a stalled replay, want it cut at once", d)
	}
	if _, err := io.Copy(io.Discard, resp.Body); err == nil {
		t.Error("the stalled body ended cleanly, want it cut (short of its Content-Length)")
	}
}

// TestStreamEndedMissingBytes: a finished stream whose journal files miss
// bytes (a segment cut short by something other than its writer) is
// answered unavailable before any body, not with a body cut at the hole
// that a client would resume into again and again.
func TestStreamEndedMissingBytes(t *testing.T) {
	a := startDaemon(t)
	a.createSandbox("box")
	res := a.exec("box", wire.Exec{ID: "short", Argv: []string{"printf", "hello world"}})
	if res.Exit.Code != 0 || string(res.Stdout) != "hello world" {
		t.Fatalf("exec: %q %+v", res.Stdout, res.Exit)
	}
	segs, _ := filepath.Glob(filepath.Join(sessionDirOf(t, a.state, "short"), "journal", "stdout", "*.seg"))
	if len(segs) != 1 {
		t.Fatalf("segments: %v", segs)
	}
	if err := os.Truncate(segs[0], 5); err != nil {
		t.Fatal(err)
	}
	a.wantError(a.do("GET", "/v1/sandboxes/box/sessions/short/streams/stdout", nil), 503, wire.CodeUnavailable)
	// From a cursor before the hole too: the body would end at the
	// exit record's length, which the files no longer reach.
	a.wantError(a.do("GET", "/v1/sandboxes/box/sessions/short/streams/stdout?cursor=2", nil), 503, wire.CodeUnavailable)
}
