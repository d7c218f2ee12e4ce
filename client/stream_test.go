package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"testing"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/wire"
)

func exitJSON(t *testing.T, reason string, code int) string {
	t.Helper()
	b, err := json.Marshal(wire.Exit{Reason: reason, Code: code})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestStreamBodyForms reads the plain stream endpoint's two forms, whole
// and cut, from a loopback server that answers exactly as the test says:
// a client that read either form the wrong way, or took a cut body for a
// whole one, fails here.
func TestStreamBodyForms(t *testing.T) {
	exit3, exit9, lost := exitJSON(t, wire.ExitExited, 3), exitJSON(t, wire.ExitExited, 9), exitJSON(t, wire.ExitLost, 0)
	// ended answers in the ended form: Content-Length, end in headers.
	ended := func(body, how, exit string, length int) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			h := w.Header()
			h.Set("Content-Type", "application/octet-stream")
			h.Set("Content-Length", strconv.Itoa(length))
			h.Set(wire.HeaderStreamEnd, how)
			h.Set(wire.HeaderExit, exit)
			w.WriteHeader(200)
			io.WriteString(w, body)
			if len(body) < length {
				w.(http.Flusher).Flush()
				panic(http.ErrAbortHandler) // cut, as runnerd does
			}
		}
	}
	// running answers in the running form: chunked, end in trailers
	// (none when trailers is nil), optionally cut before the last chunk.
	running := func(body string, header, trailers map[string]string, cut bool) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			h := w.Header()
			h.Set("Content-Type", "application/octet-stream")
			h.Set("Trailer", wire.HeaderStreamEnd+", "+wire.HeaderExit+", "+wire.HeaderError)
			for k, v := range header {
				h.Set(k, v)
			}
			w.WriteHeader(200)
			io.WriteString(w, body)
			w.(http.Flusher).Flush()
			if cut {
				panic(http.ErrAbortHandler)
			}
			for k, v := range trailers {
				h.Set(k, v)
			}
		}
	}
	tests := []struct {
		name    string
		handler http.HandlerFunc
		body    string
		how     string // "": the body or the open must fail as unavailable
		code    int    // exit code when how is exit
		errKind adapter.Kind
	}{
		{"ended form", ended("hello", "exit", exit3, 5), "hello", "exit", 3, ""},
		{"ended form, empty", ended("", "exit", exit3, 0), "", "exit", 3, ""},
		{"ended form, lost", ended("bye", "lost", lost, 3), "bye", "lost", 0, ""},
		{"ended form cut short of its Content-Length", ended("hel", "exit", exit3, 5), "hel", "", 0, ""},
		{"running form", running("hello", nil, map[string]string{wire.HeaderStreamEnd: "exit", wire.HeaderExit: exit3}, false), "hello", "exit", 3, ""},
		// runnerd may put the exit record in a running form's headers too;
		// the trailer is what the body ended with.
		{"running form, exit header differs", running("hi", map[string]string{wire.HeaderExit: exit9}, map[string]string{wire.HeaderStreamEnd: "exit", wire.HeaderExit: exit3}, false), "hi", "exit", 3, ""},
		{"running form, more", running("hi", nil, map[string]string{wire.HeaderStreamEnd: "more"}, false), "hi", "more", 0, ""},
		{"running form, error", running("", nil, map[string]string{wire.HeaderStreamEnd: "error", wire.HeaderError: string(wire.CodeTruncated)}, false), "", "error", 0, adapter.KindTruncated},
		{"running form without the trailer", running("hi", nil, nil, false), "hi", "", 0, ""},
		{"running form cut before its last chunk", running("hi", nil, nil, true), "hi", "", 0, ""},
		{"end header without a Content-Length", func(w http.ResponseWriter, r *http.Request) {
			// HTTP/1.1 with Connection: close and no length: the body
			// ends when the connection does, so a cut looks whole.
			conn, bw, err := w.(http.Hijacker).Hijack()
			if err != nil {
				return
			}
			defer conn.Close()
			bw.WriteString("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: application/octet-stream\r\n" +
				wire.HeaderStreamEnd + ": exit\r\n" + wire.HeaderExit + ": " + exit3 + "\r\n\r\nhel")
			bw.Flush()
		}, "", "", 0, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newTestClient(t, serve(t, tt.handler))
			body, err := c.Stream(context.Background(), "box", "s1", "stdout", 0, false)
			if err != nil {
				if tt.how == "" && errors.Is(err, adapter.ErrUnavailable) {
					return
				}
				t.Fatalf("Stream: %v", err)
			}
			defer body.Close()
			got, rerr := io.ReadAll(body)
			if string(got) != tt.body || body.N() != int64(len(tt.body)) {
				t.Errorf("body: got %q (N %d), want %q", got, body.N(), tt.body)
			}
			if tt.how == "" {
				if !errors.Is(rerr, adapter.ErrUnavailable) {
					t.Fatalf("read a cut body: got %v, want unavailable", rerr)
				}
				if end, err := body.End(); err == nil {
					t.Fatalf("End of a cut body: got %+v, want an error", end)
				}
				return
			}
			if rerr != nil {
				t.Fatalf("read: %v", rerr)
			}
			end, err := body.End()
			if err != nil || end.How != tt.how {
				t.Fatalf("End: got %+v, %v; want %s", end, err, tt.how)
			}
			switch tt.how {
			case "exit", "lost":
				if end.Exit == nil || end.Exit.Code != tt.code || (end.Exit.Reason == wire.ExitLost) != (tt.how == "lost") {
					t.Fatalf("End exit: got %+v, want %s code %d", end.Exit, tt.how, tt.code)
				}
			case "error":
				if adapter.KindOf(end.Err) != tt.errKind {
					t.Fatalf("End error: got %v, want kind %v", end.Err, tt.errKind)
				}
			}
		})
	}
}
