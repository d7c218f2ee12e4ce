package daemon_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/agentrunner/runner/internal/ostest"
	"github.com/agentrunner/runner/wire"
)

// inotifyInstances counts this process's inotify descriptors.
var inotifyInstances = ostest.InotifyInstances

// Many more follow streams than the kernel's 128 inotify instances per
// user: 200 stream requests and 20 pipes attaches (40 readers) on one
// runnerd all end with the exact bytes and the exit, and runnerd holds one
// inotify instance for all of them.
func TestManyFollowers(t *testing.T) {
	const (
		sessions = 4
		streams  = 200 // follow=1 stream requests, spread over sessions and stdout/stderr
		attaches = 20
	)
	before := inotifyInstances(t)
	a := startDaemon(t)
	a.createSandbox("box")
	// "R" on each stream tells a follower its stream is open; then the
	// session waits for a line on stdin, so every follower is at the live
	// end when the rest arrives.
	script := `printf R; printf R >&2; read a; printf "%s-out" "$a"; printf "%s-err" "$a" >&2; exit 3`
	ids := make([]string, sessions)
	for i := range ids {
		ids[i] = fmt.Sprintf("s%d", i)
		a.spawn("box", wire.CreateSession{ID: ids[i], Argv: []string{"sh", "-c", script}})
	}
	want := func(id, stream string) string {
		if stream == "stdout" {
			return "R" + id + "-out"
		}
		return "R" + id + "-err"
	}

	ctx := ctxFor(t, 60*time.Second)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: -1}}
	defer hc.CloseIdleConnections()
	var (
		opened sync.WaitGroup // every follower has its first byte (or failed)
		ended  sync.WaitGroup
		mu     sync.Mutex
		errs   []string
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		errs = append(errs, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	for i := range streams {
		id := ids[i%sessions]
		stream := []string{"stdout", "stderr"}[i/sessions%2]
		opened.Add(1)
		ended.Add(1)
		go func() {
			defer ended.Done()
			first := true
			defer func() {
				if first {
					opened.Done()
				}
			}()
			req, _ := http.NewRequestWithContext(ctx, "GET", a.base+"/v1/sandboxes/box/sessions/"+id+"/streams/"+stream+"?follow=1", nil)
			req.Header.Set("Authorization", "Bearer "+a.token)
			resp, err := hc.Do(req)
			if err != nil {
				fail("stream %s/%s: %v", id, stream, err)
				return
			}
			defer resp.Body.Close()
			b := make([]byte, 1)
			if _, err := io.ReadFull(resp.Body, b); err != nil {
				fail("stream %s/%s: first byte: %v", id, stream, err)
				return
			}
			first = false
			opened.Done()
			rest, err := io.ReadAll(resp.Body)
			if got := string(b) + string(rest); err != nil || got != want(id, stream) {
				fail("stream %s/%s: got %q, %v; want %q", id, stream, got, err, want(id, stream))
				return
			}
			if end := resp.Trailer.Get(wire.HeaderStreamEnd); end != "exit" {
				fail("stream %s/%s: %s %q, want exit (%s %q)", id, stream, wire.HeaderStreamEnd, end, wire.HeaderError, resp.Trailer.Get(wire.HeaderError))
				return
			}
			var exit wire.Exit
			if err := jsonUnmarshal([]byte(resp.Trailer.Get(wire.HeaderExit)), &exit); err != nil || exit.Code != 3 {
				fail("stream %s/%s: exit trailer %q: %v", id, stream, resp.Trailer.Get(wire.HeaderExit), err)
			}
		}()
	}
	for i := range attaches {
		id := ids[i%sessions]
		opened.Add(1)
		ended.Add(1)
		go func() {
			defer ended.Done()
			if err := followAttach(ctx, a, id, opened.Done, want(id, "stdout"), want(id, "stderr")); err != nil {
				fail("attach %s: %v", id, err)
			}
		}()
	}
	opened.Wait()
	if got := inotifyInstances(t); got > before+1 {
		t.Errorf("inotify instances with %d followers: got %d, want at most %d", streams+2*attaches, got, before+1)
	}
	for _, id := range ids {
		a.must("POST", "/v1/sandboxes/box/sessions/"+id+"/stdin", id+"\n", 204, nil)
	}
	ended.Wait()
	for _, e := range errs {
		t.Error(e)
	}
}

// followAttach attaches to a pipes session, calls opened once the attach
// is up, and checks it ends with exactly the given bytes and exit code 3.
func followAttach(ctx context.Context, a *api, id string, opened func(), stdout, stderr string) error {
	conn, _, err := websocket.Dial(ctx, strings.Replace(a.base, "http", "ws", 1)+"/v1/sandboxes/box/sessions/"+id+"/attach",
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + a.token}}})
	opened()
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	defer conn.CloseNow()
	got := map[string]string{}
	for {
		_, msg, err := conn.Read(ctx)
		if err != nil {
			return fmt.Errorf("read: %w (got %q)", err, got)
		}
		f, err := wire.ParseFrame(msg)
		if err != nil {
			return err
		}
		switch f.Kind {
		case wire.FrameData:
			got[f.Stream.StreamName()] += string(f.Payload)
		case wire.FrameExit:
			e, err := f.Exit()
			if err != nil {
				return err
			}
			if got["stdout"] != stdout || got["stderr"] != stderr || e.Code != 3 {
				return fmt.Errorf("got stdout %q, stderr %q, exit %d; want %q, %q, 3", got["stdout"], got["stderr"], e.Code, stdout, stderr)
			}
			return nil
		case wire.FrameHeartbeat:
		default:
			return fmt.Errorf("frame %v, want data or exit", f.Kind)
		}
	}
}
