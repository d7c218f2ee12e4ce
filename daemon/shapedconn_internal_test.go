package daemon

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"
)

// recordConn is a net.Conn that keeps what is written to it.
type recordConn struct {
	net.Conn // nil: only the methods below are used
	out      bytes.Buffer
}

func (c *recordConn) Write(p []byte) (int, error)         { return c.out.Write(p) }
func (c *recordConn) SetReadDeadline(time.Time) error     { return nil }
func (c *recordConn) SetDeadline(time.Time) error         { return nil }
func (c *recordConn) ReadFrom(r io.Reader) (int64, error) { return c.out.ReadFrom(r) }

// TestShapedConnOnlyNetHTTPsOwnAnswer: the rewrite applies only to the
// first write after net/http armed the connection to read a request, so
// a response body (bytes a command chose) or a WebSocket frame that reads
// exactly like net/http's error answer passes untouched. Without the arming
// the hostile bodies below were rewritten into a JSON error.
func TestShapedConnOnlyNetHTTPsOwnAnswer(t *testing.T) {
	s := &server{metrics: newMetrics(""), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	own := []byte("HTTP/1.1 400 Bad Request" + netHTTPErrorHeaders + "400 Bad Request")
	future := time.Now().Add(time.Hour)
	for _, tc := range []struct {
		name   string
		steps  func(c *shapedConn)
		shaped bool // the last write, own, was rewritten
	}{
		{"armed by a request read", func(c *shapedConn) { c.SetReadDeadline(future) }, true},
		{"never armed", func(c *shapedConn) {}, false},
		{"a response body after its header", func(c *shapedConn) {
			c.SetReadDeadline(future)
			c.Write([]byte("HTTP/1.1 200 OK\r\nDate: x\r\n\r\n"))
		}, false},
		{"a deadline in the past (abortPendingRead)", func(c *shapedConn) {
			c.SetReadDeadline(time.Now().Add(-time.Hour))
		}, false},
		{"a WebSocket after its 101", func(c *shapedConn) {
			c.SetReadDeadline(future)
			c.Write([]byte("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n"))
			c.SetReadDeadline(future)
		}, false},
		{"a body sent with ReadFrom", func(c *shapedConn) {
			c.SetReadDeadline(future)
			c.ReadFrom(bytes.NewReader([]byte("HTTP/1.1 200 OK\r\nDate: x\r\n\r\n")))
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := &recordConn{}
			c := &shapedConn{Conn: rc, s: s}
			tc.steps(c)
			before := rc.out.Len()
			if n, err := c.Write(own); n != len(own) || err != nil {
				t.Fatalf("Write: %d, %v", n, err)
			}
			last := rc.out.Bytes()[before:]
			if got := !bytes.Equal(last, own); got != tc.shaped {
				t.Fatalf("rewritten %v, want %v: wrote %q", got, tc.shaped, last)
			}
			if tc.shaped && !bytes.Contains(last, []byte("Runner-Error: invalid\r\n")) {
				t.Fatalf("shaped answer lacks Runner-Error: %q", last)
			}
		})
	}
}
