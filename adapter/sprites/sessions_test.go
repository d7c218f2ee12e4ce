package sprites_test

import (
	"errors"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/sprites"
	"github.com/agentrunner/runner/adapter/sprites/spritestest"
)

// startDetached starts argv, reads its session_info and disconnects; the
// command runs on (max_run_after_disconnect=0).
func startDetached(t *testing.T, f fixture, name string, argv ...string) string {
	t.Helper()
	ctx := ctxFor(t)
	s, err := f.c.Exec(ctx, name, sprites.ExecOptions{Argv: argv, MaxRunAfterDisconnect: sprites.RunForever})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ev, err := s.Recv(ctx)
	if err != nil || ev.Kind != sprites.EventInfo {
		t.Fatalf("first event %+v, %v; want session_info", ev, err)
	}
	return ev.Info.SessionID
}

func TestListSessionsAndKill(t *testing.T) {
	f := newFixture(t, spritestest.Options{})
	mustCreate(t, f, "k")
	ctx := ctxFor(t)
	term := startDetached(t, f, "k", "sleep", "30")
	stubborn := startDetached(t, f, "k", "/bin/sh", "-c", "trap '' TERM; echo; while :; do sleep 0.05; done")

	list, err := f.c.ListSessions(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, s := range list {
		ids[s.ID] = true
		// sprites-go's shape: workdir and last_activity are read too.
		if s.Workdir != "/" || s.LastActivity.IsZero() || s.Created.IsZero() {
			t.Errorf("session %s: workdir %q, created %v, last activity %v; want /, both set", s.ID, s.Workdir, s.Created, s.LastActivity)
		}
	}
	if len(list) != 2 || !ids[term] || !ids[stubborn] {
		t.Fatalf("sessions %+v, want %s and %s", list, term, stubborn)
	}

	r, err := f.c.Kill(ctx, "k", term, "TERM", 5*time.Second)
	if err != nil || !r.Signalled || !r.Exited || r.ExitCode != 128+15 || r.TimedOut {
		t.Errorf("kill TERM: %+v, %v; want signalled, exited 143", r, err)
	}
	r, err = f.c.Kill(ctx, "k", stubborn, "SIGTERM", 300*time.Millisecond)
	if err != nil || !r.TimedOut || !r.Exited || r.ExitCode != 128+9 {
		t.Errorf("kill of a TERM-ignoring command: %+v, %v; want timed out, exited 137", r, err)
	}
	_, err = f.c.Kill(ctx, "k", term, "TERM", time.Second)
	if !errors.Is(err, adapter.ErrCommandExited) {
		t.Errorf("kill of an exited session: %v, want ErrCommandExited", err)
	}
	_, err = f.c.Kill(ctx, "k", "999999999", "TERM", time.Second)
	if !errors.Is(err, sprites.ErrNoSession) {
		t.Errorf("kill of an unknown session: %v, want ErrNoSession", err)
	}
	wantKind(t, "kill of an unknown session", err, adapter.KindProvider)
	_, err = f.c.Kill(ctx, "k", term, "BOGUS", time.Second)
	wantKind(t, "kill with a bad signal", err, adapter.KindInvalid)

	// wait 0: the signal only.
	quick := startDetached(t, f, "k", "sleep", "30")
	r, err = f.c.Kill(ctx, "k", quick, "KILL", 0)
	if err != nil || !r.Signalled {
		t.Errorf("kill without waiting: %+v, %v; want signalled", r, err)
	}
	pid, _ := strconv.Atoi(quick)
	if !waitFor(t, 5*time.Second, func() bool {
		for _, p := range f.srv.Running("k") {
			if p == pid {
				return false
			}
		}
		return true
	}) {
		t.Error("the KILLed command still runs")
	}
	if list, err := f.c.ListSessions(ctx, "k"); err != nil || len(list) != 0 {
		t.Errorf("sessions after the kills: %+v, %v; want none", list, err)
	}
}

// TestKillStreamCut: a progress stream that ends before "complete" while
// waiting leaves the outcome unknown.
func TestKillStreamCut(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sprites/x/exec/7/kill", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = w.Write([]byte(`{"type":"signal","signal":"SIGTERM","pid":7}` + "\n"))
	})
	c, err := sprites.New(sprites.Config{Token: sprites.NewSecret("t"), BaseURL: newHTTPServer(t, mux)})
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.Kill(ctxFor(t), "x", "7", "TERM", time.Second)
	var ue *adapter.UnavailableError
	if !errors.As(err, &ue) || !ue.Uncertain || r.Exited {
		t.Errorf("got %+v, %v; want an uncertain UnavailableError and no exit", r, err)
	}
}
