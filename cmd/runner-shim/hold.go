package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"sync"
	"time"

	"github.com/agentrunner/runner/shim"
	"github.com/agentrunner/runner/shim/sessiondir"
)

// The Sprites Tasks API (superfly/sprites-docs, "Keeping a Sprite
// Running"): HTTP over the unix socket /.sprite/api.sock, virtual host
// "sprite". PUT /v1/tasks/{name} {"expire": "..."} creates or refreshes a
// task (200); DELETE /v1/tasks/{name} releases it (204, 404 if missing).
// While at least one task is live the sprite does not pause; one that is
// not refreshed expires by itself (at most an hour), so a shim that dies
// without releasing holds the sprite only until then. The docs' heartbeat
// pattern is a short expiry refreshed on a shorter interval.
const (
	// taskExpire is the expiry of each refresh: a shim that was killed
	// (or frozen) stops holding the sprite this long after its last
	// heartbeat.
	taskExpire = 2 * time.Minute
	// taskRefresh is the heartbeat: four missed ones before the hold
	// lapses.
	taskRefresh = 30 * time.Second
	// taskCallTimeout bounds one call to the socket.
	taskCallTimeout = 10 * time.Second
)

// taskHold is one held task. Its heartbeat goroutine is owned by the
// hold: release stops it, waits for it, then deletes the task.
type taskHold struct {
	name string
	hc   *http.Client
	stop context.CancelFunc
	wg   sync.WaitGroup
	once sync.Once
}

// hooks are what runner-shim adds to the supervisor (shim.Hooks): the
// Sprites task hold, a provider's quirk kept out of the supervisor.
var hooks = shim.Hooks{Running: holdTask}

// holdTask starts holding a task named after the session while the
// command runs, when the spec asks for it (Spec.HoldTask, set by spawn
// --hold-task), and returns its release, called once the exit record is
// published. A socket that cannot be reached is logged and tried again at
// every heartbeat: the session never fails for it.
func holdTask(spec sessiondir.Spec) (release func()) {
	if spec.HoldTask == "" {
		return func() {}
	}
	return newTaskHold(spec.HoldTask, "runner-shim-"+spec.ID).release
}

func newTaskHold(sock, name string) *taskHold {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
		DisableKeepAlives: true,
	}
	ctx, stop := context.WithCancel(context.Background())
	h := &taskHold{name: name, hc: &http.Client{Transport: tr, Timeout: taskCallTimeout}, stop: stop}
	h.wg.Add(1)
	go h.heartbeat(ctx)
	return h
}

func (h *taskHold) heartbeat(ctx context.Context) {
	defer h.wg.Done()
	body := fmt.Appendf(nil, `{"expire":"%ds"}`, int(taskExpire/time.Second))
	t := time.NewTicker(taskRefresh)
	defer t.Stop()
	failing := false
	for {
		err := h.call(ctx, http.MethodPut, body, http.StatusOK, http.StatusCreated)
		switch {
		case err != nil && !failing && ctx.Err() == nil:
			fmt.Fprintf(os.Stderr, "shim: hold task %s: %v (trying again every %v)\n", h.name, err, taskRefresh)
			failing = true
		case err == nil:
			failing = false
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// release stops the heartbeat and deletes the task (absent is fine). It
// is idempotent.
func (h *taskHold) release() {
	h.once.Do(func() {
		h.stop()
		h.wg.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), taskCallTimeout)
		defer cancel()
		if err := h.call(ctx, http.MethodDelete, nil, http.StatusNoContent, http.StatusOK, http.StatusNotFound); err != nil {
			fmt.Fprintf(os.Stderr, "shim: release task %s: %v (it expires by itself)\n", h.name, err)
		}
		h.hc.CloseIdleConnections()
	})
}

func (h *taskHold) call(ctx context.Context, method string, body []byte, ok ...int) error {
	req, err := http.NewRequestWithContext(ctx, method, "http://sprite/v1/tasks/"+url.PathEscape(h.name), bytes.NewReader(body))
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := h.hc.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	for _, s := range ok {
		if resp.StatusCode == s {
			return nil
		}
	}
	return fmt.Errorf("%s: HTTP %d", method, resp.StatusCode)
}
