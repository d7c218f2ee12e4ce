package daemon

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/agentrunner/runner/daemon/apierr"
	"github.com/agentrunner/runner/shim/launch"
	"github.com/agentrunner/runner/shim/sessiondir"
	"github.com/agentrunner/runner/wire"
)

// fakeShimSocket serves dir's control socket and answers every request
// with an error body of code, as the shim's protocol frames it (8-byte
// header: magic 0xD6, version 1, status 2 = error, 0, big-endian length).
func fakeShimSocket(t *testing.T, dir string, code string) {
	t.Helper()
	ln, err := net.Listen("unix", filepath.Join(dir, sessiondir.SocketFile))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			body, _ := json.Marshal(map[string]string{"code": code, "detail": "kill: operation not permitted"})
			var hdr [8]byte
			for {
				if _, err := io.ReadFull(c, hdr[:]); err != nil {
					break
				}
				if _, err := io.CopyN(io.Discard, c, int64(binary.BigEndian.Uint32(hdr[4:]))); err != nil {
					break
				}
				out := []byte{0xD6, 1, 2, 0, 0, 0, 0, 0}
				binary.BigEndian.PutUint32(out[4:], uint32(len(body)))
				if _, err := c.Write(append(out, body...)); err != nil {
					break
				}
			}
			c.Close()
		}
	}()
}

// TestShimProviderErrorIsProvider: the shim answers "provider" when it
// failed doing what was asked (a kill or resize the kernel refused). That
// is not transient: runnerd answers 500 provider. Before the error table
// the code fell through to a bare error that classify answered as 503
// unavailable, which told clients to retry.
func TestShimProviderErrorIsProvider(t *testing.T) {
	dir := t.TempDir()
	fakeShimSocket(t, dir, "provider")
	ctx := context.Background()
	c, err := launch.Dial(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	err = c.Signal(ctx, 15)
	if err == nil {
		t.Fatal("Signal succeeded against a shim that answers provider")
	}
	ae := classify(err)
	if ae.Code != wire.CodeProvider || ae.Status != http.StatusInternalServerError {
		t.Errorf("classify(%v) = %d %s, want 500 provider", err, ae.Status, ae.Code)
	}
}

// TestUncertainErrorBody: an uncertain answer carries the structured
// field and, for clients that predate it, the detail prefix.
func TestUncertainErrorBody(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"errUncertain", apierr.Uncertain("session %s is still starting; retry", "s1"), true},
		{"plain unavailable", apierr.Unavailable("runnerd is stopping"), false},
	}
	s := &server{metrics: newMetrics(""), log: slog.New(slog.DiscardHandler)}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			s.writeError(rec, httptest.NewRequest("POST", "/v1/sandboxes/a/sessions/s1/terminate", nil), tc.err)
			var body wire.ErrorBody
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatal(err)
			}
			if rec.Code != 503 || body.Error.Code != wire.CodeUnavailable || body.Error.Uncertain != tc.want {
				t.Errorf("answer %d %+v, want 503 unavailable with uncertain %v", rec.Code, body.Error, tc.want)
			}
			if tc.want && body.Error.Detail[:len(wire.DetailUncertain)+1] != wire.DetailUncertain+":" {
				t.Errorf("detail %q, want the %q prefix older clients read", body.Error.Detail, wire.DetailUncertain)
			}
		})
	}
}
