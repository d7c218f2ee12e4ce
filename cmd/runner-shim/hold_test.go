package main

import (
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
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
	dir, err := os.MkdirTemp("", "hold")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "api.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var calls []string
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		calls = append(calls, r.Method+" "+r.Host+r.URL.Path+" "+string(b))
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

	h := newTaskHold(sock, "runner-shim-s1")
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n := len(calls)
		mu.Unlock()
		if n > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	h.release()
	h.release() // idempotent
	mu.Lock()
	defer mu.Unlock()
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
