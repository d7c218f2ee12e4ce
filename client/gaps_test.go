package client_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/wire"
)

func newAdapter(t *testing.T, d *daemon, endpoint string) (*client.Client, *client.Adapter) {
	t.Helper()
	c := newClient(t, d, endpoint)
	a, err := client.NewAdapter(context.Background(), c, client.AdapterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return c, a
}

// newClient is a client of d at endpoint, closed after the test.
func newClient(t *testing.T, d *daemon, endpoint string) *client.Client {
	t.Helper()
	c, err := client.New(endpoint, d.token, conformanceOptions)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestTerminatedAcrossRestarts: the terminated reason comes from runnerd's
// durable exit record, so a fresh adapter talking to a restarted runnerd
// still reports it, with the true code and signal; a plain SIGTERM through
// the signal endpoint is signaled.
func TestTerminatedAcrossRestarts(t *testing.T) {
	d := startDaemon(t)
	ctx := context.Background()
	c, a := newAdapter(t, d, d.url())
	h, err := a.Create(ctx, "durable", adapter.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, sp := range []struct{ id, script string }{
		{"killed", "echo ready; exec sleep 60"},
		{"trapped", "trap 'exit 7' TERM; echo ready; while :; do sleep 0.05; done"},
		{"signaled", "echo ready; exec sleep 60"},
	} {
		st, err := a.Spawn(ctx, h, adapter.Shell(sp.script), adapter.SpawnOptions{SessionID: sp.id})
		if err != nil {
			t.Fatal(err)
		}
		var got bytes.Buffer
		var cur adapter.Cursor
		readUntil(t, st, &cur, &got, func() bool { return strings.Contains(got.String(), "ready") })
		st.Close()
	}
	if _, err := a.TerminateSession(ctx, h, "killed", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := a.TerminateSession(ctx, h, "trapped", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := c.Signal(ctx, "durable", "signaled", "TERM"); err != nil {
		t.Fatal(err)
	}

	d.kill9()
	d.restart(t)
	_, a2 := newAdapter(t, d, d.url())
	want := map[string]adapter.Exit{
		"killed":   {Code: -1, Signal: "SIGTERM", Reason: adapter.ReasonTerminated},
		"trapped":  {Code: 7, Reason: adapter.ReasonTerminated},
		"signaled": {Code: -1, Signal: "SIGTERM", Reason: adapter.ReasonSignaled},
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		infos, err := a2.Sessions(ctx, h)
		if err != nil {
			t.Fatal(err)
		}
		ok := true
		for _, in := range infos {
			if in.Exit == nil || *in.Exit != want[in.ID] {
				ok = false
				if time.Now().After(deadline) {
					t.Fatalf("session %s after restarts: got %+v (%s), want %v", in.ID, in.Exit, in.State, want[in.ID])
				}
			}
		}
		if ok && len(infos) == len(want) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	for id, w := range want {
		st, err := a2.Attach(ctx, h, id, adapter.Cursor{})
		if err != nil {
			t.Fatal(err)
		}
		var got bytes.Buffer
		var cur adapter.Cursor
		term := readUntil(t, st, &cur, &got, func() bool { return false })
		st.Close()
		if term == nil || term.Exit == nil || *term.Exit != w {
			t.Errorf("attach %s after restarts: got %v, want %v", id, term, w)
		}
	}
	if err := a2.Destroy(ctx, h); err != nil {
		t.Fatal(err)
	}
}

// hookProxy forwards to a daemon and runs before (when set) ahead of
// forwarding each request.
type hookProxy struct {
	rp     *httputil.ReverseProxy
	srv    *http.Server
	before atomic.Pointer[func(*http.Request)]
}

func startHookProxy(t *testing.T, upstream string) *hookProxy {
	t.Helper()
	u, err := url.Parse(upstream)
	if err != nil {
		t.Fatal(err)
	}
	p := &hookProxy{rp: httputil.NewSingleHostReverseProxy(u)}
	p.rp.Transport = &http.Transport{DisableKeepAlives: true}
	p.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if f := p.before.Load(); f != nil {
			(*f)(r)
		}
		p.rp.ServeHTTP(w, r)
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = p.srv.Serve(ln) }()
	t.Cleanup(func() {
		_ = p.srv.Close()
		<-done
		p.rp.Transport.(*http.Transport).CloseIdleConnections()
	})
	p.srv.Addr = ln.Addr().String()
	return p
}

// TestDestroyStaleHandle: Destroy of a handle whose incarnation was
// replaced never removes the newer sandbox of the same name, also when
// the replacement happens while the Destroy is in flight.
func TestDestroyStaleHandle(t *testing.T) {
	d := startDaemon(t)
	ctx := context.Background()
	direct, _ := newAdapter(t, d, d.url())
	p := startHookProxy(t, d.url())
	_, a := newAdapter(t, d, "http://"+p.srv.Addr)

	stale, err := a.Create(ctx, "stale", adapter.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The re-create lands between whatever the adapter checks and its
	// DELETE reaching runnerd.
	var fresh wire.Sandbox
	var once sync.Once
	hook := func(r *http.Request) {
		if r.Method != http.MethodDelete {
			return
		}
		once.Do(func() {
			if err := direct.DeleteSandbox(ctx, "stale"); err != nil {
				t.Error(err)
			}
			if fresh, err = direct.CreateSandbox(ctx, wire.CreateSandbox{Name: "stale"}); err != nil {
				t.Error(err)
			}
		})
	}
	p.before.Store(&hook)
	if err := a.Destroy(ctx, stale); err != nil {
		t.Fatalf("destroy of a stale handle: %v", err)
	}
	p.before.Store(nil)
	got, err := direct.GetSandbox(ctx, "stale")
	if err != nil || got.Incarnation != fresh.Incarnation {
		t.Fatalf("after destroying the stale handle: got %+v %v, want the new incarnation %s alive", got, err, fresh.Incarnation)
	}
	// Every handle-scoped call of the stale handle is not_found.
	if _, err := a.Sessions(ctx, stale); !errors.Is(err, adapter.ErrNotFound) {
		t.Errorf("Sessions of a stale handle: got %v, want ErrNotFound", err)
	}
	if err := a.WriteStdin(ctx, stale, "x", []byte("x")); !errors.Is(err, adapter.ErrNotFound) {
		t.Errorf("WriteStdin of a stale handle: got %v, want ErrNotFound", err)
	}

	// Concurrent: a stale Destroy hammers while the name is re-created.
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Go(func() {
		for !stop.Load() {
			if err := a.Destroy(ctx, stale); err != nil {
				t.Errorf("stale destroy: %v", err)
				return
			}
		}
	})
	for range 10 {
		if err := direct.DeleteSandbox(ctx, "stale"); err != nil {
			t.Fatal(err)
		}
		sb, err := direct.CreateSandbox(ctx, wire.CreateSandbox{Name: "stale"})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
		if got, err := direct.GetSandbox(ctx, "stale"); err != nil || got.Incarnation != sb.Incarnation {
			t.Fatalf("a stale destroy removed the new sandbox: got %+v %v", got, err)
		}
	}
	stop.Store(true)
	wg.Wait()
}

// TestSessionInfoLiveLengths: SessionInfo of a running session reports the
// bytes recorded so far per stream.
func TestSessionInfoLiveLengths(t *testing.T) {
	d := startDaemon(t)
	ctx := context.Background()
	_, a := newAdapter(t, d, d.url())
	h, err := a.Create(ctx, "lengths", adapter.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Destroy(ctx, h)
	st, err := a.Spawn(ctx, h, adapter.Shell("printf abc; printf de >&2; exec sleep 60"), adapter.SpawnOptions{SessionID: "s"})
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		infos, err := a.Sessions(ctx, h)
		if err != nil || len(infos) != 1 {
			t.Fatalf("Sessions: %v %v", infos, err)
		}
		in := infos[0]
		if in.State != adapter.SessionRunning {
			t.Fatalf("session ended: %+v", in)
		}
		if in.Stdout == 3 && in.Stderr == 2 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("lengths: got stdout %d stderr %d, want 3 and 2", in.Stdout, in.Stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestDiscoverListenFile: Discover finds the daemon through the listen
// file it writes, and with nothing that says where a daemon listens it
// returns an error instead of guessing 127.0.0.1:7323.
func TestDiscoverListenFile(t *testing.T) {
	d := startDaemon(t)
	for _, k := range []string{client.EnvURL, client.EnvToken, client.EnvListen, "STATE_DIRECTORY", "XDG_STATE_HOME"} {
		t.Setenv(k, "")
	}
	t.Setenv("HOME", t.TempDir())

	t.Setenv(client.EnvState, d.state)
	c := discovered(t, d.url())
	if _, err := c.Capabilities(context.Background()); err != nil {
		t.Fatalf("call the discovered daemon: %v", err)
	}

	empty := t.TempDir()
	if err := os.WriteFile(filepath.Join(empty, "token"), []byte("tok\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(client.EnvState, empty)
	l, err := client.Discover()
	if err == nil || !strings.Contains(err.Error(), wire.ListenFile) {
		t.Fatalf("Discover with no listen file or socket: got %v, %v; want an error naming %s", l, err, wire.ListenFile)
	}
}
