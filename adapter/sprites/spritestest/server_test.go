package spritestest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter/sprites/spritestest"
	"github.com/coder/websocket"
)

// These tests speak the wire protocol raw (no package sprites), so the
// stand-in's quirks are pinned independently of the client that must
// survive them.

func ctxFor(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func create(t *testing.T, s *spritestest.Server, name string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctxFor(t), http.MethodPost, s.URL()+"/v1/sprites", strings.NewReader(`{"name":"`+name+`"}`))
	req.Header.Set("Authorization", "Bearer "+s.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("create %s: HTTP %d", name, resp.StatusCode)
	}
}

type frames struct {
	info     map[string]any
	out      []byte
	exit     []byte // the raw exit message, nil when none came
	textExit []byte // the JSON exit message, nil when none came
	// textFirst: the JSON exit message came before some output.
	textFirst bool
	close     websocket.StatusCode
	// exitToClose is how long the close came after the exit frame.
	exitToClose time.Duration
}

// runRaw runs argv and reads every message to the close.
func runRaw(t *testing.T, s *spritestest.Server, name string, argv ...string) frames {
	t.Helper()
	q := url.Values{"cmd": argv}
	h := http.Header{}
	h.Set("Authorization", "Bearer "+s.Token)
	ctx := ctxFor(t)
	conn, _, err := websocket.Dial(ctx, s.URL()+"/v1/sprites/"+name+"/exec?"+q.Encode(), &websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	var f frames
	var exitAt time.Time
	for {
		typ, msg, err := conn.Read(ctx)
		if err != nil {
			f.close = websocket.CloseStatus(err)
			if !exitAt.IsZero() {
				f.exitToClose = time.Since(exitAt)
			}
			return f
		}
		switch {
		case typ == websocket.MessageText && f.info == nil:
			_ = json.Unmarshal(msg, &f.info)
		case typ == websocket.MessageText:
			var m map[string]any
			if json.Unmarshal(msg, &m) != nil || m["type"] != "exit" || f.textExit != nil || f.exit != nil {
				t.Errorf("unexpected text message %s", msg)
			}
			f.textExit = msg
		case msg[0] == 1:
			if f.info == nil {
				t.Error("output before session_info")
			}
			if f.textExit != nil {
				f.textFirst = true
			}
			f.out = append(f.out, msg[1:]...)
		case msg[0] == 3:
			f.exit = msg
			exitAt = time.Now()
		}
	}
}

func TestExecWireFrames(t *testing.T) {
	s := spritestest.New(t, spritestest.Options{})
	create(t, s, "wire")
	f := runRaw(t, s, "wire", "/bin/sh", "-c", "printf 'a\\000b'; exit 300")
	if f.info["type"] != "session_info" || f.info["tty"] != false || f.info["session_id"] == "" {
		t.Errorf("session_info %v", f.info)
	}
	if !bytes.Equal(f.out, []byte("a\x00b")) {
		t.Errorf("stdout %q, want a NUL b", f.out)
	}
	// 300 does not fit the one-byte field: the shell's own exit status is
	// already 300 mod 256.
	if !bytes.Equal(f.exit, []byte{3, 300 % 256}) || f.close != websocket.StatusNormalClosure {
		t.Errorf("exit % x close %d, want 03 2c and 1000", f.exit, f.close)
	}
	// The JSON exit message comes first, before the output still in the
	// pipes (the asyncapi's ExitMessage, seen early by a field capture).
	if string(f.textExit) != `{"exit_code":44,"type":"exit"}` || !f.textFirst {
		t.Errorf("text exit %s (before output: %v), want exit_code 44 before the output", f.textExit, f.textFirst)
	}
}

// TestCloseHold: the socket stays open about CloseHold after the exit
// byte, whoever starts the close handshake (sprites-py #24, #26).
func TestCloseHold(t *testing.T) {
	s := spritestest.New(t, spritestest.Options{CloseHold: 1500 * time.Millisecond})
	create(t, s, "hold")
	f := runRaw(t, s, "hold", "true")
	if !bytes.Equal(f.exit, []byte{3, 0}) || f.exitToClose < 1400*time.Millisecond {
		t.Errorf("exit % x, close %v after it; want 03 00 and about 1.5 s", f.exit, f.exitToClose)
	}
	// A client that answers the exit with its own close waits the hold
	// for the server's reply.
	h := http.Header{}
	h.Set("Authorization", "Bearer "+s.Token)
	ctx := ctxFor(t)
	conn, _, err := websocket.Dial(ctx, s.URL()+"/v1/sprites/hold/exec?cmd=true", &websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	for {
		_, msg, err := conn.Read(ctx)
		if err != nil {
			t.Fatalf("read before the exit frame: %v", err)
		}
		if len(msg) == 2 && msg[0] == 3 {
			break
		}
	}
	start := time.Now()
	go func() { _, _, _ = conn.Read(ctx) }() // coder/websocket reads the reply here
	_ = conn.Close(websocket.StatusNormalClosure, "")
	if d := time.Since(start); d < 1400*time.Millisecond {
		t.Errorf("the close handshake took %v, want the 1.5 s hold", d)
	}
}

func TestDropExitRandomOnlyFastCommands(t *testing.T) {
	s := spritestest.New(t, spritestest.Options{DropExit: spritestest.DropExitRandom, DropRate: 1, FastCommand: time.Second})
	create(t, s, "r")
	if f := runRaw(t, s, "r", "true"); f.exit != nil || f.close != websocket.StatusNormalClosure {
		t.Errorf("fast command: exit % x close %d, want no exit frame and 1000", f.exit, f.close)
	}
	if f := runRaw(t, s, "r", "sleep", "1.3"); !bytes.Equal(f.exit, []byte{3, 0}) {
		t.Errorf("slow command: exit % x, want 03 00", f.exit)
	}
	s.SetDropExit(spritestest.DropExitNever)
	if f := runRaw(t, s, "r", "true"); !bytes.Equal(f.exit, []byte{3, 0}) {
		t.Errorf("after switching the quirk off: exit % x, want 03 00", f.exit)
	}
}

func TestDeleteKillsCommands(t *testing.T) {
	s := spritestest.New(t, spritestest.Options{})
	create(t, s, "k")
	h := http.Header{}
	h.Set("Authorization", "Bearer "+s.Token)
	ctx := ctxFor(t)
	conn, _, err := websocket.Dial(ctx, s.URL()+"/v1/sprites/k/exec?cmd=sleep&cmd=30&max_run_after_disconnect=0", &websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	if _, _, err := conn.Read(ctx); err != nil { // session_info: the process runs
		t.Fatal(err)
	}
	if len(s.Running("k")) != 1 {
		t.Fatalf("running %v, want one command", s.Running("k"))
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodDelete, s.URL()+"/v1/sprites/k", nil)
	req.Header = h
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("delete: %v %v", resp, err)
	}
	resp.Body.Close()
	var exit []byte
	for {
		typ, msg, err := conn.Read(ctx)
		if err != nil {
			if websocket.CloseStatus(err) != websocket.StatusNormalClosure {
				t.Errorf("the exec ended with %v, want a normal close", err)
			}
			break
		}
		if typ == websocket.MessageBinary && len(msg) > 0 && msg[0] == 3 {
			exit = msg
		}
	}
	if !bytes.Equal(exit, []byte{3, 128 + 9}) {
		t.Errorf("exit frame % x, want 03 89 (SIGKILL)", exit)
	}
	if _, ok := s.Dir("k"); ok {
		t.Error("the sprite survived its delete")
	}
}
