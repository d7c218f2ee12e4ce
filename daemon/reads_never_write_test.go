package daemon_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/agentrunner/runner/journal"
	"github.com/agentrunner/runner/shim/sessiondir"
	"github.com/agentrunner/runner/wire"
)

// Reads never write (issue #37 item 1): the sessions manager records a
// session's exit, once, when its journal says it ended; a GET of the
// session, of the listing, of a stream (plain and follow) or an attach
// answers it and writes nothing. A write of the registry (bbolt) always
// changes registry.db (its meta page), so the file's size and mtime
// holding still across the reads says no read committed anything.

// regStat is registry.db's size and mtime once they held still for a
// while: every commit in flight has landed.
func regStat(t *testing.T, state string) (int64, time.Time) {
	t.Helper()
	fi := stableStat(t, filepath.Join(state, "registry.db"), 300*time.Millisecond, 10*time.Second)
	return fi.Size(), fi.ModTime()
}

// readAll reads session id of sandbox box every way a client can, checks
// each answer says exited with code, and returns.
func readAll(t *testing.T, a *api, id string, code int) {
	t.Helper()
	base := "/v1/sandboxes/box/sessions/"
	var ss wire.Session
	a.must("GET", base+id, nil, 200, &ss)
	if ss.State != wire.SessionExited || ss.Exit == nil || ss.Exit.Code != code {
		t.Fatalf("GET session %s: state %q exit %+v, want exited code %d", id, ss.State, ss.Exit, code)
	}
	var list wire.SessionList
	a.must("GET", "/v1/sandboxes/box/sessions", nil, 200, &list)
	if len(list.Sessions) == 0 {
		t.Fatalf("listing: no sessions")
	}
	for _, l := range list.Sessions {
		if l.ID == id && (l.State != wire.SessionExited || l.Exit == nil || l.Exit.Code != code) {
			t.Fatalf("listing %s: state %q exit %+v, want exited code %d", id, l.State, l.Exit, code)
		}
	}
	for _, q := range []string{"", "?follow=1"} {
		r := a.do("GET", base+id+"/streams/stdout"+q, nil)
		if r.status != 200 || r.header.Get(wire.HeaderStreamEnd) != "exit" {
			t.Fatalf("GET stream%s: status %d, %s %q, want 200 exit", q, r.status, wire.HeaderStreamEnd, r.header.Get(wire.HeaderStreamEnd))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, strings.Replace(a.base, "http", "ws", 1)+base+id+"/attach",
		&websocket.DialOptions{HTTPClient: a.hc, HTTPHeader: map[string][]string{"Authorization": {"Bearer " + a.token}}})
	if err != nil {
		t.Fatalf("attach: %v", err)
	}
	defer conn.CloseNow()
	for {
		_, msg, err := conn.Read(ctx)
		if err != nil {
			t.Fatalf("attach: read: %v", err)
		}
		f, err := wire.ParseFrame(msg)
		if err != nil {
			t.Fatal(err)
		}
		if f.Kind == wire.FrameExit {
			if e, err := f.Exit(); err != nil || e.Code != code {
				t.Fatalf("attach exit frame: %+v, %v; want code %d", e, err, code)
			}
			return
		}
	}
}

// checkNoWrite fails when registry.db changed since size and mtime.
func checkNoWrite(t *testing.T, state string, size int64, mtime time.Time, what string) {
	t.Helper()
	if s, m := regStat(t, state); s != size || !m.Equal(mtime) {
		t.Errorf("registry written by %s: registry.db size %d mtime %v, was %d %v; want no write", what, s, m, size, mtime)
	}
}

// A session that ends while runnerd runs: its exit reaches the registry
// with no reader at all, and the reads that follow write nothing.
func TestReadsNeverWrite(t *testing.T) {
	state := t.TempDir()
	a, p := startProcess(t, state)
	a.createSandbox("box")
	a.spawn("box", wire.CreateSession{ID: "quick", Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 7"}})
	waitGlob(t, filepath.Join(state, "s", "[^.]*", "journal", "exit.json"), 10*time.Second)
	size, mtime := regStat(t, state)

	readAll(t, a, "quick", 7)
	checkNoWrite(t, state, size, mtime, "GET session, listing, streams and attach")

	// The record was written by the manager before any read: a runnerd
	// killed now leaves it in the registry.
	p.kill(syscall.SIGKILL)
	rec := recordedSession(t, state, "box", "quick")
	if rec.State != wire.SessionExited || rec.Exit == nil || rec.Exit.Code != 7 {
		t.Fatalf("record with no reader: %s exit %+v, want exited code 7", rec.State, rec.Exit)
	}
	// It is the shim's own exit record, byte for byte.
	j, err := journal.Open(filepath.Join(state, "s", rec.Key, "journal"))
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	e, ok, err := j.Exit()
	if err != nil || !ok {
		t.Fatalf("journal exit record: %v, %v", ok, err)
	}
	want, _ := json.Marshal(sessiondir.WireExit(e))
	got, _ := json.Marshal(rec.Exit)
	if !bytes.Equal(got, want) {
		t.Errorf("recorded exit %s, want the shim's %s", got, want)
	}
	// A restarted runnerd answers it as recorded, and its reads write nothing.
	a2, _ := startProcess(t, state)
	size, mtime = regStat(t, state)
	readAll(t, a2, "quick", 7)
	checkNoWrite(t, state, size, mtime, "the reads after a restart")
}

// A session whose shim dies without an exit record (SIGKILL): the manager
// finishes its journal as lost and records it, with no reader.
func TestLostRecordedWithoutReader(t *testing.T) {
	state := t.TempDir()
	a, p := startProcess(t, state)
	a.createSandbox("box")
	ss := a.spawn("box", wire.CreateSession{ID: "doomed", Argv: []string{"sleep", "1000"}})
	pidFile := waitGlob(t, filepath.Join(state, "s", "[^.]*", "shim.pid"), 10*time.Second)
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	shimPID, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(shimPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// The command runs on (until the end, when this test kills it by pid):
	// its cgroup leaf stays busy, so no leaf release settles the session;
	// only the journal says the shim is gone.
	defer syscall.Kill(ss.PID, syscall.SIGKILL)
	waitGlob(t, filepath.Join(state, "s", "[^.]*", "journal", "exit.json"), 10*time.Second)
	regStat(t, state)
	p.kill(syscall.SIGKILL)
	if rec := recordedSession(t, state, "box", "doomed"); rec.State != wire.SessionLost || rec.Exit == nil || rec.Exit.Reason != wire.ExitLost {
		t.Fatalf("record with no reader: %s exit %+v, want lost", rec.State, rec.Exit)
	}
}

// After runnerd is killed, an exit that happened while it was down is
// recorded at adoption (before it serves): the first reads write nothing.
func TestRestartReadsNeverWrite(t *testing.T) {
	state := t.TempDir()
	a, p := startProcess(t, state)
	// The mark is in the workspace, the one host directory a pod sees.
	release := filepath.Join(a.createSandbox("box").WorkspaceOnHost(), "release")
	a.spawn("box", wire.CreateSession{ID: "late", Argv: []string{"sh", "-c", "while [ ! -e release ]; do sleep 0.05; done; echo done; exit 5"}})
	regStat(t, state)
	p.kill(syscall.SIGKILL)
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitGlob(t, filepath.Join(state, "s", "[^.]*", "journal", "exit.json"), 10*time.Second)

	a2, _ := startProcess(t, state)
	size, mtime := regStat(t, state)
	readAll(t, a2, "late", 5)
	checkNoWrite(t, state, size, mtime, "the first reads after a restart")
}
