package main

import (
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentrunner/runner/shim/sessiondir"
)

// TestTaskHold: the hold upserts its task on the Tasks API socket at
// once (PUT /v1/tasks/{name} with an expiry), and release deletes it and
// stops the heartbeat.
func TestTaskHold(t *testing.T) {
	_, sock, got := tasksAPI(t)
	h := newTaskHold(sock, "runner-shim-s1")
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := len(got())
		if n > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	h.release()
	h.release() // idempotent
	calls := got()
	want := []string{`PUT sprite/v1/tasks/runner-shim-s1 {"expire":"120s"}`, `DELETE sprite/v1/tasks/runner-shim-s1 `}
	if strings.Join(calls, "\n") != strings.Join(want, "\n") {
		t.Errorf("calls:\n%s\nwant:\n%s", strings.Join(calls, "\n"), strings.Join(want, "\n"))
	}
}

// TestSpecHoldTaskMustBeAbsolute: the session's shim does not run in the
// caller's directory, so a relative socket path is refused.
func TestSpecHoldTaskMustBeAbsolute(t *testing.T) {
	err := sessiondir.Spec{ID: "s", Argv: []string{"true"}, HoldTask: ".sprite/api.sock"}.Validate()
	if err == nil || !strings.Contains(err.Error(), "hold_task") {
		t.Errorf("validate = %v, want the relative hold_task refused", err)
	}
}

// tasksAPI serves a stand-in Sprites Tasks API on a unix socket in a new
// short directory (200 to PUT, 204 to DELETE) and returns the directory,
// the socket and what it was sent so far, one "METHOD HOSTPATH BODY" per
// call.
func tasksAPI(t *testing.T) (dir, sock string, calls func() []string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "hold")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock = filepath.Join(dir, "api.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []string
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, r.Method+" "+r.Host+r.URL.Path+" "+string(b))
		mu.Unlock()
		if r.Method == http.MethodDelete {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		w.WriteHeader(http.StatusOK)
	})}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close(); <-done })
	return dir, sock, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
}
