package daemon_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/wire"
)

// TestNULInCommandIsInvalid: a NUL in env, argv or cwd is the caller's
// mistake (400 invalid), never a retryable unavailable.
func TestNULInCommandIsInvalid(t *testing.T) {
	a := startDaemon(t)
	a.createSandbox("box")
	for _, req := range []wire.CreateSession{
		{Argv: []string{"true"}, Env: []string{"A=b\x00c"}},
		{Argv: []string{"tr\x00ue"}},
		{Argv: []string{"true"}, Cwd: "a\x00b"},
	} {
		a.wantError(a.do("POST", "/v1/sandboxes/box/sessions", req), 400, wire.CodeInvalid)
		a.wantError(a.do("POST", "/v1/sandboxes/box/exec", wire.Exec{Argv: req.Argv, Env: req.Env, Cwd: req.Cwd}), 400, wire.CodeInvalid)
	}
}

// TestDuplicateKeysRefused: a body naming a key twice (also in another
// case, which encoding/json matches to the same field) is 400 invalid at
// any depth, and nothing is created.
func TestDuplicateKeysRefused(t *testing.T) {
	a := startDaemon(t)
	for _, body := range []string{
		`{"name":"a","name":"b"}`,
		`{"name":"a","NAME":"b"}`,
		`{"name":"c","network":{"allow":[],"allow":["example.com"]}}`,
		`{"name":"d","limits":{"pids":1,"pids":2}}`,
	} {
		r := a.do("POST", "/v1/sandboxes", body)
		a.wantError(r, 400, wire.CodeInvalid)
		if d := r.errBody(t).Detail; !strings.Contains(d, "duplicate key") {
			t.Errorf("body %s: detail %q, want it to name the duplicate key", body, d)
		}
	}
	var list wire.SandboxList
	a.must("GET", "/v1/sandboxes", nil, 200, &list)
	if len(list.Sandboxes) != 0 {
		t.Fatalf("sandboxes after refused creates: %+v", list.Sandboxes)
	}
	a.createSandbox("box")
	a.wantError(a.do("POST", "/v1/sandboxes/box/sessions/x/terminate", `{"grace_ms":1,"grace_ms":2}`), 400, wire.CodeInvalid)
	// Equal values in an array, or one key in sibling objects, are fine.
	a.must("POST", "/v1/sandboxes/box/sessions", `{"id":"s","argv":["true"],"env":["A=1","A=1"]}`, 201, nil)
}

// rawRoundTrip writes req on a fresh connection and reads one response.
func rawRoundTrip(t *testing.T, a *api, req []byte) *http.Response {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(a.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	go c.Write(req) // may fail half-way: the server stops reading
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// TestNetHTTPErrorsHaveShape: the answers net/http makes itself (a 2 MiB
// header, a malformed request line, a missing Host, an unsupported
// transfer encoding) and the mux's fallbacks carry Runner-Error and the
// JSON error body like every other error.
func TestNetHTTPErrorsHaveShape(t *testing.T) {
	a := startDaemon(t)
	huge := "GET /v1/sandboxes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + testToken + "\r\nX-Big: " + strings.Repeat("a", 2<<20) + "\r\n\r\n"
	for _, tc := range []struct {
		name   string
		req    string
		status int
	}{
		{"header too large", huge, 431},
		{"malformed request line", "GARBAGE\r\n\r\n", 400},
		{"missing host", "GET /healthz HTTP/1.1\r\n\r\n", 400},
		{"unsupported transfer encoding", "POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 400},
		{"no such route", "GET /v1/nothing HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + testToken + "\r\n\r\n", 404},
		{"wrong method", "PATCH /v1/sandboxes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + testToken + "\r\n\r\n", 405},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := rawRoundTrip(t, a, []byte(tc.req))
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatalf("read body: %v", err)
			}
			if resp.StatusCode != tc.status || resp.Header.Get(wire.HeaderError) != string(wire.CodeInvalid) {
				t.Fatalf("got %d %q %s, want %d invalid", resp.StatusCode, resp.Header.Get(wire.HeaderError), body, tc.status)
			}
			var eb wire.ErrorBody
			dec := json.NewDecoder(bytes.NewReader(body))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&eb); err != nil || eb.Error.Code != wire.CodeInvalid || eb.Error.Detail == "" {
				t.Fatalf("body %q: got %+v (%v), want an invalid error with a detail", body, eb, err)
			}
			if resp.Header.Get("Content-Type") != "application/json" {
				t.Errorf("Content-Type %q", resp.Header.Get("Content-Type"))
			}
		})
	}
}
