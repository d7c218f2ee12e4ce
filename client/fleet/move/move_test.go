package move_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/client/fleet"
	"github.com/agentrunner/runner/client/fleet/move"
	"github.com/agentrunner/runner/internal/s3test"
	"github.com/agentrunner/runner/wire"
)

// parkedBox is a sandbox made for a move: a file of random bytes in its
// workspace, written by a session, a second session that ended with exit
// code 7 after writing to both streams, then parked.
type parkedBox struct {
	name      string
	workspace string // on the source's disk
	data      []byte // the file's bytes
	sessions  map[string]wire.Session
	journals  map[string][2][]byte // session id -> stdout, stderr as read on the source
}

func makeParked(t *testing.T, ctx context.Context, c *client.Client, name string) parkedBox {
	t.Helper()
	b := parkedBox{name: name, data: make([]byte, 3<<20+17), sessions: map[string]wire.Session{}, journals: map[string][2][]byte{}}
	rand.Read(b.data)
	sb, err := c.CreateSandbox(ctx, wire.CreateSandbox{Name: name})
	if err != nil {
		t.Fatalf("create %s: %v", name, err)
	}
	b.workspace = sb.WorkspaceOnHost()
	// The file goes in through a session's stdin, 1 MiB a write.
	w, _, err := c.CreateSession(ctx, name, wire.CreateSession{ID: "write", Argv: []string{"sh", "-c", "cat > data.bin && echo written"}})
	if err != nil {
		t.Fatalf("spawn the writer: %v", err)
	}
	for off := 0; off < len(b.data); off += 1 << 20 {
		if err := c.WriteStdin(ctx, name, w.ID, b.data[off:min(off+1<<20, len(b.data))]); err != nil {
			t.Fatalf("write stdin: %v", err)
		}
	}
	if err := c.CloseStdin(ctx, name, w.ID); err != nil {
		t.Fatal(err)
	}
	waitEnded(t, ctx, c, name, w.ID)
	s, _, err := c.CreateSession(ctx, name, wire.CreateSession{ID: "turn", Argv: []string{"sh", "-c", "printf 'the agent said\\000'; printf oops >&2; exit 7"}})
	if err != nil {
		t.Fatalf("spawn: %v", err)
	}
	s = waitEnded(t, ctx, c, name, s.ID)
	if s.Exit == nil || s.Exit.Code != 7 {
		t.Fatalf("session exit: %+v, want code 7", s.Exit)
	}
	for _, id := range []string{"write", "turn"} {
		s, err := c.Session(ctx, name, id)
		if err != nil {
			t.Fatal(err)
		}
		b.sessions[id] = s
		b.journals[id] = [2][]byte{readStream(t, ctx, c, name, id, "stdout"), readStream(t, ctx, c, name, id, "stderr")}
	}
	if _, err := c.Suspend(ctx, name); err != nil {
		t.Fatalf("park %s: %v", name, err)
	}
	return b
}

// waitEnded polls a session until it has ended.
func waitEnded(t *testing.T, ctx context.Context, c *client.Client, sandbox, id string) wire.Session {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		s, err := c.Session(ctx, sandbox, id)
		if err != nil {
			t.Fatal(err)
		}
		if s.State != wire.SessionRunning {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("session %s/%s did not end", sandbox, id)
		}
	}
}

// readStream reads a stream of a session whole, from byte 0.
func readStream(t *testing.T, ctx context.Context, c *client.Client, sandbox, id, stream string) []byte {
	t.Helper()
	body, err := c.Stream(ctx, sandbox, id, stream, 0, false)
	if err != nil {
		t.Fatalf("stream %s of %s/%s: %v", stream, sandbox, id, err)
	}
	defer body.Close()
	b, err := io.ReadAll(body)
	if err != nil {
		t.Fatalf("read %s of %s/%s: %v", stream, sandbox, id, err)
	}
	return b
}

// checkArrived checks that box is on c whole: parked, its file
// byte-exact, each session with the same exit and journals byte-exact
// from byte 0.
func checkArrived(t *testing.T, ctx context.Context, c *client.Client, box parkedBox) {
	t.Helper()
	sb, err := c.GetSandbox(ctx, box.name)
	if err != nil {
		t.Fatalf("get %s on the target: %v", box.name, err)
	}
	if sb.State != wire.SandboxSuspended {
		t.Fatalf("%s arrived %s, want suspended (parked)", box.name, sb.State)
	}
	for id, want := range box.sessions {
		got, err := c.Session(ctx, box.name, id)
		if err != nil {
			t.Fatalf("session %s on the target: %v", id, err)
		}
		if got.State != want.State || got.Exit == nil || got.Exit.Code != want.Exit.Code || got.Exit.Reason != want.Exit.Reason || got.Exit.Signal != want.Exit.Signal {
			t.Fatalf("session %s on the target: state %s exit %+v, want %s %+v", id, got.State, got.Exit, want.State, want.Exit)
		}
		for i, st := range []string{"stdout", "stderr"} {
			if b := readStream(t, ctx, c, box.name, id, st); !bytes.Equal(b, box.journals[id][i]) {
				t.Fatalf("session %s %s on the target: got %q, want %q", id, st, b, box.journals[id][i])
			}
		}
	}
	// The file, read by a command of the moved sandbox, resumed.
	if _, err := c.Resume(ctx, box.name); err != nil {
		t.Fatalf("resume %s on the target: %v", box.name, err)
	}
	res, err := c.Exec(ctx, box.name, wire.Exec{Argv: []string{"cat", "data.bin"}})
	if err != nil || res.Exit.Code != 0 {
		t.Fatalf("read the file on the target: %v %+v", err, res.Exit)
	}
	if !bytes.Equal(res.Stdout, box.data) {
		t.Fatalf("the file on the target: %d bytes, want %d byte-exact", len(res.Stdout), len(box.data))
	}
}

// checkGone checks that runner r holds nothing of sandbox name: its API
// says not_found, its state directory has no checkpoint store and no
// session directory left of it.
func checkGone(t *testing.T, ctx context.Context, c *client.Client, r *runnerd, box parkedBox, sessionDirsBefore int) {
	t.Helper()
	name := box.name
	if _, err := c.GetSandbox(ctx, name); !errors.Is(err, adapter.ErrNotFound) {
		t.Fatalf("get %s on the source after the move: got %v, want not_found", name, err)
	}
	if !strings.HasPrefix(box.workspace, r.state+"/") {
		t.Fatalf("workspace %s is not under the source's state %s", box.workspace, r.state)
	}
	for _, p := range []string{filepath.Join(r.state, "checkpoints", name), filepath.Join(r.state, "sandboxes", name), box.workspace} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Fatalf("%s on the source after the move: %v, want none", p, err)
		}
	}
	ents, _ := os.ReadDir(filepath.Join(r.state, "s"))
	if len(ents) != sessionDirsBefore {
		t.Fatalf("session directories on the source after the move: %d, want %d", len(ents), sessionDirsBefore)
	}
}

// TestMove moves a parked sandbox between two real runnerds through a
// real S3 server (SeaweedFS): the file arrives byte-exact, its sessions
// with the same ids and exits and their journals from byte 0, the name
// routes to the target, the source holds nothing of it, and the bucket
// holds only the route. A sandbox with a session running refuses and is
// left as it was; a second mover loses to the lease and changes nothing.
func TestMove(t *testing.T) {
	needCheckpoints(t)
	srv := s3test.Start(t)
	st, _ := openStore(t, srv)
	ra, rb := startRunnerd(t, freeAddr(t)), startRunnerd(t, freeAddr(t))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pool, err := fleet.New(ctx, fleet.Static{{Name: "ra", URL: ra.url(), Token: token}, {Name: "rb", URL: rb.url(), Token: token}}, fleet.Options{Refresh: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ca, _ := pool.Client("ra")
	cb, _ := pool.Client("rb")
	mv := move.New(pool, st, move.Options{Holder: "test"})

	box := makeParked(t, ctx, ca, "ra-box")
	// One session directory stays on A: the sandbox below, running.
	busy := "ra-busy"
	if _, err := ca.CreateSandbox(ctx, wire.CreateSandbox{Name: busy}); err != nil {
		t.Fatal(err)
	}
	run, _, err := ca.CreateSession(ctx, busy, wire.CreateSession{ID: "long", Argv: []string{"sleep", "600"}})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("running session refuses", func(t *testing.T) {
		_, err := mv.Move(ctx, busy, "rb")
		if !errors.Is(err, adapter.ErrInvalid) {
			t.Fatalf("Move of a sandbox with a running session: got %v, want invalid (conflict)", err)
		}
		sb, err := ca.GetSandbox(ctx, busy)
		if err != nil || sb.State != wire.SandboxRunning {
			t.Fatalf("%s after the refused move: %+v %v, want running", busy, sb, err)
		}
		if s, err := ca.Session(ctx, busy, run.ID); err != nil || s.State != wire.SessionRunning {
			t.Fatalf("its session after the refused move: %+v %v, want running", s, err)
		}
		if _, err := cb.GetSandbox(ctx, busy); !errors.Is(err, adapter.ErrNotFound) {
			t.Fatalf("%s on the target after the refused move: got %v, want not_found", busy, err)
		}
	})

	t.Run("second mover loses", func(t *testing.T) {
		other, err := st.Acquire(ctx, move.Lease{Sandbox: box.name, Holder: "other-control-plane", From: "ra", To: "rb"}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		_, err = mv.Move(ctx, box.name, "rb")
		var held *move.LeaseHeldError
		if !errors.As(err, &held) || held.Held.Holder != "other-control-plane" {
			t.Fatalf("Move while another mover holds the lease: got %v, want *LeaseHeldError", err)
		}
		if sb, err := ca.GetSandbox(ctx, box.name); err != nil || sb.State != wire.SandboxSuspended {
			t.Fatalf("%s after the lost move: %+v %v, want parked on the source", box.name, sb, err)
		}
		if _, err := cb.GetSandbox(ctx, box.name); !errors.Is(err, adapter.ErrNotFound) {
			t.Fatalf("%s on the target after the lost move: got %v, want not_found", box.name, err)
		}
		if err := st.Release(ctx, other); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("target holds the name", func(t *testing.T) {
		// A sandbox of the same name on the target is not the move's to
		// overwrite or remove: refused, both left as they were.
		const twin = "ra-twin"
		if _, err := ca.CreateSandbox(ctx, wire.CreateSandbox{Name: twin}); err != nil {
			t.Fatal(err)
		}
		if _, err := cb.CreateSandbox(ctx, wire.CreateSandbox{Name: twin}); err != nil {
			t.Fatal(err)
		}
		if res, err := cb.Exec(ctx, twin, wire.Exec{Argv: []string{"sh", "-c", "echo mine > own.txt"}}); err != nil || res.Exit.Code != 0 {
			t.Fatalf("write on the target's twin: %v %+v", err, res.Exit)
		}
		if _, err := mv.Move(ctx, twin, "rb"); !errors.Is(err, adapter.ErrInvalid) {
			t.Fatalf("Move onto a runner holding the name: got %v, want invalid", err)
		}
		res, err := cb.Exec(ctx, twin, wire.Exec{Argv: []string{"cat", "own.txt"}})
		if err != nil || string(res.Stdout) != "mine\n" {
			t.Fatalf("the target's twin after the refused move: %q %v, want its own file", res.Stdout, err)
		}
		if sb, err := ca.GetSandbox(ctx, twin); err != nil || sb.State != wire.SandboxRunning {
			t.Fatalf("the source's twin after the refused move: %+v %v, want untouched (running)", sb, err)
		}
		for _, c := range []*client.Client{ca, cb} {
			if err := c.DeleteSandbox(ctx, twin); err != nil {
				t.Fatal(err)
			}
		}
	})

	before, _ := os.ReadDir(filepath.Join(ra.state, "s"))
	ownDirs := len(before) - len(box.sessions)
	start := time.Now()
	to, err := mv.Move(ctx, box.name, "")
	if err != nil {
		t.Fatalf("Move: %v", err)
	}
	t.Logf("moved %d bytes of file and %d sessions in %s", len(box.data), len(box.sessions), time.Since(start))
	if to != "rb" {
		t.Fatalf("Move went to %q, want rb (the only other runner)", to)
	}
	if r, _ := pool.RunnerOf(box.name); r != "rb" {
		t.Fatalf("the pool routes %s to %s, want rb", box.name, r)
	}
	checkGone(t, ctx, ca, ra, box, ownDirs)
	checkArrived(t, ctx, cb, box)
	// Through the pool, by its old name.
	if _, err := pool.Get(ctx, box.name); err != nil {
		t.Fatalf("pool.Get(%s) after the move: %v", box.name, err)
	}
	// A control plane that starts now routes it from the bucket.
	pool2, err := fleet.New(ctx, fleet.Static{{Name: "ra", URL: ra.url(), Token: token}, {Name: "rb", URL: rb.url(), Token: token}}, fleet.Options{Refresh: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer pool2.Close()
	if n, err := move.New(pool2, st, move.Options{}).LoadRoutes(ctx); err != nil || n != 1 {
		t.Fatalf("LoadRoutes: %d, %v; want 1", n, err)
	}
	if _, err := pool2.Get(ctx, box.name); err != nil {
		t.Fatalf("a new pool's Get(%s) after LoadRoutes: %v", box.name, err)
	}
	if keys := st.Keys(ctx, t); len(keys) != 1 || keys[0] != "routes/"+box.name {
		t.Fatalf("bucket after the move: %v, want only the route", keys)
	}
	// A control plane that never loaded the routes: ra's not_found is
	// checked against the bucket's route (unavailable, retry), and the
	// retry reaches rb; never not_found for a sandbox that lives.
	pool3, err := fleet.New(ctx, fleet.Static{{Name: "ra", URL: ra.url(), Token: token}, {Name: "rb", URL: rb.url(), Token: token}}, fleet.Options{Refresh: -1, Routes: st})
	if err != nil {
		t.Fatal(err)
	}
	defer pool3.Close()
	if _, err := pool3.Get(ctx, box.name); !errors.Is(err, adapter.ErrUnavailable) {
		t.Fatalf("a stale pool's first Get(%s): got %v, want unavailable (moved; retry)", box.name, err)
	}
	if _, err := pool3.Get(ctx, box.name); err != nil {
		t.Fatalf("a stale pool's retry of Get(%s): %v", box.name, err)
	}
	if _, err := pool3.Get(ctx, "ra-nosuch"); !errors.Is(err, adapter.ErrNotFound) {
		t.Fatalf("Get of a sandbox no route names: got %v, want not_found", err)
	}

	t.Run("archive and restore", func(t *testing.T) {
		// Parked and archived: on no runner, only in the bucket.
		if _, err := cb.Suspend(ctx, box.name); err != nil {
			t.Fatal(err)
		}
		if err := mv.Archive(ctx, box.name); err != nil {
			t.Fatalf("Archive: %v", err)
		}
		if _, err := cb.GetSandbox(ctx, box.name); !errors.Is(err, adapter.ErrNotFound) {
			t.Fatalf("%s on rb after Archive: got %v, want not_found", box.name, err)
		}
		if _, err := pool.Get(ctx, box.name); !errors.Is(err, adapter.ErrUnavailable) {
			t.Fatalf("pool.Get of an archived sandbox: got %v, want unavailable (never not_found)", err)
		}
		// A pool that never heard of the archive: its destroy reads the
		// route first and never "succeeds" at a runner that lacks it.
		fresh, err := fleet.New(ctx, fleet.Static{{Name: "ra", URL: ra.url(), Token: token}, {Name: "rb", URL: rb.url(), Token: token}}, fleet.Options{Refresh: -1, Routes: st})
		if err != nil {
			t.Fatal(err)
		}
		defer fresh.Close()
		if err := fresh.Destroy(ctx, adapter.Handle{Name: box.name}); !errors.Is(err, adapter.ErrUnavailable) {
			t.Fatalf("a fresh pool's Destroy of an archived sandbox: got %v, want unavailable", err)
		}
		if _, err := mv.Move(ctx, box.name, "ra"); !errors.Is(err, adapter.ErrInvalid) {
			t.Fatalf("Move of an archived sandbox: got %v, want invalid", err)
		}
		want := []string{"routes/" + box.name, "sandboxes/" + box.name + "/checkpoint", "sandboxes/" + box.name + "/manifest.json", "sandboxes/" + box.name + "/sessions.tar"}
		if keys := st.Keys(ctx, t); !slices.Equal(keys, want) {
			t.Fatalf("bucket after Archive: %v, want %v", keys, want)
		}
		// Any runner of the fleet restores it: here the one it was made on.
		to, err := mv.Restore(ctx, box.name, "ra")
		if err != nil || to != "ra" {
			t.Fatalf("Restore: %q, %v", to, err)
		}
		checkArrived(t, ctx, ca, box)
		if r, _ := pool.RunnerOf(box.name); r != "ra" {
			t.Fatalf("the pool routes %s to %q after Restore, want ra", box.name, r)
		}
		if _, err := mv.Restore(ctx, box.name, "rb"); !errors.Is(err, adapter.ErrInvalid) {
			t.Fatalf("Restore of a sandbox on a runner: got %v, want invalid", err)
		}
		if keys := st.Keys(ctx, t); len(keys) != 1 || keys[0] != "routes/"+box.name {
			t.Fatalf("bucket after Restore: %v, want only the route", keys)
		}
	})
	if _, err := ca.Terminate(ctx, busy, run.ID, 0); err != nil {
		t.Fatal(err)
	}
}
