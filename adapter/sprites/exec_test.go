package sprites_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/sprites"
	"github.com/agentrunner/runner/adapter/sprites/spritestest"
	"github.com/coder/websocket"
)

func sh(script string, args ...string) []string {
	return append([]string{"/bin/sh", "-c", script, "sh"}, args...)
}

// TestExitCodes carries every code through the one-byte field, the
// signal deaths (128+n) included.
func TestExitCodes(t *testing.T) {
	f := newFixture(t, spritestest.Options{})
	mustCreate(t, f, "codes")
	tests := []struct {
		name   string
		script string
		want   int
	}{
		{"zero", "exit 0", 0},
		{"three", "exit 3", 3},
		{"255", "exit 255", 255},
		{"128", "exit 128", 128},
		{"SIGKILL", "kill -KILL $$", 128 + 9},
		{"SIGTERM", "kill -TERM $$", 128 + 15},
		{"missing program", "exec /no/such/program", 127},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := f.c.Run(ctxFor(t), "codes", sprites.ExecOptions{Argv: sh(tt.script)}, nil)
			if err != nil {
				t.Fatalf("run: %v", err)
			}
			if r.ExitCode != tt.want {
				t.Errorf("got exit %d, want %d", r.ExitCode, tt.want)
			}
		})
	}
	t.Run("program not found at start", func(t *testing.T) {
		r, err := f.c.Run(ctxFor(t), "codes", sprites.ExecOptions{Argv: []string{"/no/such/binary"}}, nil)
		if err != nil || r.ExitCode != 127 {
			t.Errorf("got exit %d, %v; want 127", r.ExitCode, err)
		}
	})
}

// TestExitFrameIsOneByte reads the stand-in's frames raw: the exit frame is
// exactly stream 3 plus ONE byte. A client that read four bytes for the
// code (the #880 bug: it matched no frame and reported a 0 nobody sent)
// fails TestExitCodes against these frames; ParseFrame's table below pins
// the decoding itself.
func TestExitFrameIsOneByte(t *testing.T) {
	srv := spritestest.New(t, spritestest.Options{})
	c, _ := sprites.New(sprites.Config{Token: sprites.NewSecret(srv.Token), BaseURL: srv.URL()})
	if _, err := c.Create(ctxFor(t), sprites.CreateRequest{Name: "raw"}); err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t)
	h := http.Header{}
	h.Set("Authorization", "Bearer "+srv.Token)
	conn, _, err := websocket.Dial(ctx, srv.URL()+"/v1/sprites/raw/exec?cmd=/bin/sh&cmd=-c&cmd=exit+3", &websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	var exit []byte
	for exit == nil {
		typ, msg, err := conn.Read(ctx)
		if err != nil {
			t.Fatalf("read before the exit frame: %v", err)
		}
		if typ == websocket.MessageBinary && len(msg) > 0 && msg[0] == sprites.StreamExit {
			exit = msg
		}
	}
	if !bytes.Equal(exit, []byte{3, 3}) {
		t.Errorf("exit frame % x, want 03 03", exit)
	}
}

func TestParseFrame(t *testing.T) {
	tests := []struct {
		name    string
		msg     []byte
		ok      bool
		wantErr bool
		want    sprites.Event
	}{
		{"stdout", []byte{1, 'h', 0, 'i'}, true, false, sprites.Event{Kind: sprites.EventStdout, Data: []byte{'h', 0, 'i'}}},
		{"stderr", []byte{2, 'e'}, true, false, sprites.Event{Kind: sprites.EventStderr, Data: []byte{'e'}}},
		{"exit 0", []byte{3, 0}, true, false, sprites.Event{Kind: sprites.EventExit, ExitCode: 0}},
		{"exit 3", []byte{3, 3}, true, false, sprites.Event{Kind: sprites.EventExit, ExitCode: 3}},
		{"exit 255 is not -1", []byte{3, 0xff}, true, false, sprites.Event{Kind: sprites.EventExit, ExitCode: 255}},
		{"exit 137", []byte{3, 137}, true, false, sprites.Event{Kind: sprites.EventExit, ExitCode: 137}},
		{"exit without a code is no exit, not 0", []byte{3}, true, false, sprites.Event{Kind: sprites.EventNoExit}},
		{"empty message skipped", []byte{}, false, false, sprites.Event{}},
		{"stdin echo skipped", []byte{0, 'x'}, false, false, sprites.Event{}},
		{"ssh agent skipped", []byte{5, 'x'}, false, false, sprites.Event{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev, ok, err := sprites.ParseFrame(tt.msg)
			if (err != nil) != tt.wantErr || ok != tt.ok {
				t.Fatalf("got ok=%v err=%v, want ok=%v err=%v", ok, err, tt.ok, tt.wantErr)
			}
			if ev.Kind != tt.want.Kind || ev.ExitCode != tt.want.ExitCode || !bytes.Equal(ev.Data, tt.want.Data) {
				t.Errorf("got %+v, want %+v", ev, tt.want)
			}
		})
	}
}

// TestMissingExitFrame: Sprites closes some fast commands with status 1000
// and no exit frame. That is ErrNoExit (unavailable, uncertain), never
// exit 0.
func TestMissingExitFrame(t *testing.T) {
	f := newFixture(t, spritestest.Options{DropExit: spritestest.DropExitAlways})
	mustCreate(t, f, "drop")
	for _, script := range []string{"echo out; exit 0", "exit 5"} {
		r, err := f.c.Run(ctxFor(t), "drop", sprites.ExecOptions{Argv: sh(script)}, nil)
		if !errors.Is(err, sprites.ErrNoExit) {
			t.Fatalf("%q: got exit %d, %v; want ErrNoExit", script, r.ExitCode, err)
		}
		wantKind(t, script, err, adapter.KindUnavailable)
		var ue *adapter.UnavailableError
		if !errors.As(err, &ue) || !ue.Uncertain {
			t.Errorf("%q: got %v, want an uncertain UnavailableError", script, err)
		}
	}
	// The same through Recv: the close is an error, not an exit event.
	s, err := f.c.Exec(ctxFor(t), "drop", sprites.ExecOptions{Argv: sh("exit 0")})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for {
		ev, err := s.Recv(ctxFor(t))
		if err != nil {
			if !errors.Is(err, sprites.ErrNoExit) {
				t.Fatalf("recv: got %v, want ErrNoExit", err)
			}
			break
		}
		if ev.Kind == sprites.EventExit {
			t.Fatalf("recv: got an exit event (code %d) the server never sent", ev.ExitCode)
		}
	}

	// Random mode: about 30 % of fast commands lose the frame; every run
	// is either the true code or ErrNoExit, never a made-up 0.
	f.srv.SetDropExit(spritestest.DropExitRandom)
	dropped := 0
	const n = 40
	for i := range n {
		r, err := f.c.Run(ctxFor(t), "drop", sprites.ExecOptions{Argv: sh("exit 7")}, nil)
		switch {
		case errors.Is(err, sprites.ErrNoExit):
			dropped++
		case err != nil:
			t.Fatalf("run %d: %v", i, err)
		case r.ExitCode != 7:
			t.Fatalf("run %d: exit %d, want 7", i, r.ExitCode)
		}
	}
	if dropped == 0 || dropped == n {
		t.Errorf("random mode dropped %d of %d exit frames, want some but not all", dropped, n)
	}
}

func TestBinaryStdoutByteExact(t *testing.T) {
	f := newFixture(t, spritestest.Options{})
	mustCreate(t, f, "bin")
	data := make([]byte, 1<<20+17)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	data[0], data[1] = 0, 0 // NULs and every other byte
	if _, err := f.c.WriteFile(ctxFor(t), "bin", "/tmp/data.bin", data, 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := f.c.Run(ctxFor(t), "bin", sprites.ExecOptions{Argv: []string{"cat", "tmp/data.bin"}}, nil)
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("cat: exit %d, %v", r.ExitCode, err)
	}
	if !bytes.Equal(r.Stdout, data) {
		t.Errorf("stdout: %d bytes differ from the %d written", len(r.Stdout), len(data))
	}
	if len(r.Stderr) != 0 {
		t.Errorf("stderr: %q, want none", r.Stderr)
	}
}

func TestStdinNULsAndEOF(t *testing.T) {
	f := newFixture(t, spritestest.Options{})
	mustCreate(t, f, "in")
	in := []byte("a\x00b\x00\x00\xff\xfe\n")
	in = append(in, bytes.Repeat([]byte{0, 1, 2, 3}, 40<<10)...) // several 32 KiB frames
	// wc -c only prints once stdin ends: the EOF frame is real.
	r, err := f.c.Run(ctxFor(t), "in", sprites.ExecOptions{Argv: sh("cat > got; wc -c < got; echo err >&2; exit 4")}, in)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if strings.TrimSpace(string(r.Stdout)) != strconv.Itoa(len(in)) || string(r.Stderr) != "err\n" || r.ExitCode != 4 {
		t.Errorf("got stdout %q stderr %q exit %d; want %d, \"err\\n\", 4", r.Stdout, r.Stderr, r.ExitCode, len(in))
	}
	back, err := f.c.ReadFile(ctxFor(t), "in", "/got")
	if err != nil || !bytes.Equal(back, in) {
		t.Errorf("stdin as received: %d bytes (%v), want the %d sent byte-exact", len(back), err, len(in))
	}

	// Interactive: write, read the echo, close, see the exit.
	ctx := ctxFor(t)
	s, err := f.c.Exec(ctx, "in", sprites.ExecOptions{Argv: []string{"cat"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.WriteStdin(ctx, []byte("x\x00y")); err != nil {
		t.Fatal(err)
	}
	var out []byte
	for len(out) < 3 {
		ev, err := s.Recv(ctx)
		if err != nil {
			t.Fatalf("recv: %v", err)
		}
		switch ev.Kind {
		case sprites.EventInfo:
			if ev.Info.SessionID == "" || ev.Info.TTY {
				t.Errorf("session_info %+v, want an id and no TTY", ev.Info)
			}
		case sprites.EventStdout:
			out = append(out, ev.Data...)
		}
	}
	if string(out) != "x\x00y" {
		t.Errorf("echo %q, want %q", out, "x\x00y")
	}
	if err := s.CloseStdin(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.CloseStdin(ctx); err != nil {
		t.Errorf("second CloseStdin: %v, want nil", err)
	}
	code := recvExit(t, ctx, s)
	if code != 0 {
		t.Errorf("cat exit %d, want 0", code)
	}
	if _, err := s.Recv(ctx); err != io.EOF {
		t.Errorf("recv after exit: %v, want io.EOF", err)
	}
	if err := s.WriteStdin(ctx, []byte("late")); !errors.Is(err, adapter.ErrCommandExited) {
		t.Errorf("write after exit: %v, want ErrCommandExited", err)
	}
}

func recvExit(t *testing.T, ctx context.Context, s *sprites.Session) int {
	t.Helper()
	for {
		ev, err := s.Recv(ctx)
		if err != nil {
			t.Fatalf("recv: %v", err)
		}
		if ev.Kind == sprites.EventExit {
			return ev.ExitCode
		}
	}
}

func TestStdinNotAnnounced(t *testing.T) {
	f := newFixture(t, spritestest.Options{})
	mustCreate(t, f, "noin")
	ctx := ctxFor(t)
	s, err := f.c.Exec(ctx, "noin", sprites.ExecOptions{Argv: []string{"cat"}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	wantKind(t, "write without stdin", s.WriteStdin(ctx, []byte("x")), adapter.KindInvalid)
	// Without stdin the command reads /dev/null: cat ends at once.
	if code := recvExit(t, ctx, s); code != 0 {
		t.Errorf("exit %d, want 0", code)
	}
}

func TestTTY(t *testing.T) {
	f := newFixture(t, spritestest.Options{})
	mustCreate(t, f, "tty")
	ctx := ctxFor(t)
	s, err := f.c.Exec(ctx, "tty", sprites.ExecOptions{
		Argv: sh(`stty size; test -t 0 && echo isatty; read line; stty size; echo "got:$line"; exit 6`),
		TTY:  true, Rows: 30, Cols: 100, Stdin: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	wantKind(t, "close stdin on a TTY", s.CloseStdin(ctx), adapter.KindInvalid)
	var out []byte
	readUntil := func(sub string) {
		t.Helper()
		for !bytes.Contains(out, []byte(sub)) {
			ev, err := s.Recv(ctx)
			if err != nil {
				t.Fatalf("recv waiting for %q (have %q): %v", sub, out, err)
			}
			switch ev.Kind {
			case sprites.EventStdout:
				out = append(out, ev.Data...)
			case sprites.EventStderr:
				t.Fatalf("stderr event in TTY mode: %q", ev.Data)
			case sprites.EventExit:
				t.Fatalf("exit %d before %q (have %q)", ev.ExitCode, sub, out)
			case sprites.EventInfo:
				if !ev.Info.TTY || ev.Info.Rows != 30 || ev.Info.Cols != 100 {
					t.Errorf("session_info %+v, want tty 30x100", ev.Info)
				}
			}
		}
	}
	readUntil("isatty")
	if !bytes.Contains(out, []byte("30 100")) {
		t.Errorf("initial size: output %q, want 30 100", out)
	}
	if err := s.Resize(ctx, 40, 120); err != nil {
		t.Fatal(err)
	}
	// No wait needed: the server handles one message at a time, so the
	// resize lands before the line that lets the second stty run.
	if err := s.WriteStdin(ctx, []byte("hello\r")); err != nil {
		t.Fatal(err)
	}
	readUntil("got:hello")
	if !bytes.Contains(out, []byte("40 120")) {
		t.Errorf("after resize: output %q, want 40 120", out)
	}
	if code := recvExit(t, ctx, s); code != 6 {
		t.Errorf("exit %d, want 6 (from the JSON exit message)", code)
	}
	// Run over a TTY: stdin written and left open, the exit from the JSON
	// message.
	r, err := f.c.Run(ctx, "tty", sprites.ExecOptions{Argv: sh(`read x; echo "got:$x"; exit 9`), TTY: true}, []byte("hi\r"))
	if err != nil || !bytes.Contains(r.Stdout, []byte("got:hi")) || r.ExitCode != 9 {
		t.Errorf("run over a TTY: %q exit %d, %v; want got:hi and 9", r.Stdout, r.ExitCode, err)
	}
	// A pipes session refuses a resize.
	p, err := f.c.Exec(ctx, "tty", sprites.ExecOptions{Argv: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	wantKind(t, "resize without a TTY", p.Resize(ctx, 10, 10), adapter.KindInvalid)
}

func TestSignal(t *testing.T) {
	f := newFixture(t, spritestest.Options{})
	mustCreate(t, f, "sig")
	ctx := ctxFor(t)
	s, err := f.c.Exec(ctx, "sig", sprites.ExecOptions{Argv: sh("echo ready; exec sleep 30")})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !s.HasCapability("signal") {
		t.Fatal("the stand-in did not advertise the signal capability")
	}
	for {
		ev, err := s.Recv(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ev.Kind == sprites.EventStdout {
			break
		}
	}
	wantKind(t, "bad signal", s.Signal(ctx, "BOGUS"), adapter.KindInvalid)
	if err := s.Signal(ctx, "TERM"); err != nil {
		t.Fatal(err)
	}
	if code := recvExit(t, ctx, s); code != 128+15 {
		t.Errorf("exit %d, want 143", code)
	}

	g := newFixture(t, spritestest.Options{NoSignalCapability: true})
	mustCreate(t, g, "sig")
	s2, err := g.c.Exec(ctx, "sig", sprites.ExecOptions{Argv: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if err := s2.Signal(ctx, "TERM"); !errors.Is(err, adapter.ErrNotSupported) {
		t.Errorf("signal without the capability: %v, want ErrNotSupported", err)
	}
}

// waitFor polls cond until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, cond func() bool) bool {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return cond()
}

// TestDisconnect: a non-TTY command dies its grace after the disconnect
// (10 s on Sprites, 500 ms here); max_run_after_disconnect keeps it; a TTY
// command runs on by default.
func TestDisconnect(t *testing.T) {
	const grace = 500 * time.Millisecond
	f := newFixture(t, spritestest.Options{DisconnectGrace: grace})
	mustCreate(t, f, "dc")
	ctx := ctxFor(t)
	start := func(opts sprites.ExecOptions) int {
		t.Helper()
		s, err := f.c.Exec(ctx, "dc", opts)
		if err != nil {
			t.Fatal(err)
		}
		ev, err := s.Recv(ctx)
		if err != nil || ev.Kind != sprites.EventInfo {
			t.Fatalf("first event %+v, %v; want session_info", ev, err)
		}
		pid, err := strconv.Atoi(ev.Info.SessionID)
		if err != nil {
			t.Fatalf("session id %q: %v", ev.Info.SessionID, err)
		}
		s.Close()
		return pid
	}
	running := func(pid int) bool {
		for _, p := range f.srv.Running("dc") {
			if p == pid {
				return true
			}
		}
		return false
	}
	kept := start(sprites.ExecOptions{Argv: []string{"sleep", "30"}, MaxRunAfterDisconnect: sprites.RunForever})
	longer := start(sprites.ExecOptions{Argv: []string{"sleep", "30"}, MaxRunAfterDisconnect: 20 * time.Second})
	tty := start(sprites.ExecOptions{Argv: []string{"sleep", "30"}, TTY: true})
	defaultGrace := start(sprites.ExecOptions{Argv: []string{"sleep", "30"}})
	if !running(defaultGrace) {
		t.Fatal("the command died at the disconnect itself, not after its grace")
	}
	if !waitFor(t, 5*time.Second, func() bool { return !running(defaultGrace) }) {
		t.Errorf("a non-TTY command outlived its %v grace after the disconnect", grace)
	}
	time.Sleep(2 * grace)
	for name, pid := range map[string]int{"max_run_after_disconnect=0": kept, "max_run_after_disconnect=20s": longer, "tty": tty} {
		if !running(pid) {
			t.Errorf("%s: the command died after the disconnect", name)
		}
	}
}

func TestEnvDirAndPath(t *testing.T) {
	f := newFixture(t, spritestest.Options{})
	mustCreate(t, f, "env")
	if _, err := f.c.WriteFile(ctxFor(t), "env", "/tmp/sub/marker", []byte("m"), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := f.c.Run(ctxFor(t), "env", sprites.ExecOptions{
		Argv: sh(`echo "$A|$B"; ls`), Env: []string{"A=1", "B=two words", "PATH=/usr/bin:/bin"}, Dir: "/tmp/sub",
	}, nil)
	if err != nil || string(r.Stdout) != "1|two words\nmarker\n" {
		t.Errorf("got %q, %v; want env and dir applied", r.Stdout, err)
	}
	_, err = f.c.Exec(ctxFor(t), "env", sprites.ExecOptions{Argv: []string{"true"}, Env: []string{"NOEQUALS"}})
	wantKind(t, "env without =", err, adapter.KindInvalid)
	_, err = f.c.Exec(ctxFor(t), "env", sprites.ExecOptions{Argv: []string{"true"}, Rows: 3})
	wantKind(t, "rows without a TTY", err, adapter.KindInvalid)
}

// TestRecvContext: the caller's context ending wins over the session's
// state.
func TestRecvContext(t *testing.T) {
	f := newFixture(t, spritestest.Options{})
	mustCreate(t, f, "ctx")
	s, err := f.c.Exec(ctxFor(t), "ctx", sprites.ExecOptions{Argv: []string{"sleep", "30"}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	var rerr error
	for rerr == nil {
		_, rerr = s.Recv(ctx)
	}
	if !errors.Is(rerr, context.DeadlineExceeded) {
		t.Errorf("got %v, want context.DeadlineExceeded", rerr)
	}
	if errors.Is(rerr, sprites.ErrNoExit) {
		t.Errorf("a caller's timeout reported as a missing exit frame: %v", rerr)
	}
}
