package sprites_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter/sprites"
	"github.com/agentrunner/runner/adapter/sprites/spritestest"
)

// TestSessionSurvivesDisconnectKill spawns a runner-shim session from an
// exec that keeps running, disconnects it, and lets the stand-in kill it
// after max_run_after_disconnect: by process group (today's reading of
// the kill endpoint's "process group") and by process tree (a reaper that
// follows descendants by parent links, Options.KillTree). The session
// must end with its true exit and every byte, written after the kill.
//
// The control beside it starts the same command directly from the exec
// (backgrounded, not detached): it is in the exec's group and tree, so
// each kill ends it and its marker never appears. That is the case a
// runner-shim without its detach would be; the session survives because
// runner-shim's spawn double-forks its session shim and calls setsid: the
// shim is in its own group, and once the middle process exits it is
// reparented (to init here), so no parent link leads from the exec to
// it and the tree walk cannot reach it either. Only a kill of everything
// the exec ever started (a per-exec cgroup) would; nothing documents one
// (the services page only says a process backgrounded inside a request
// cannot be counted on).
func TestSessionSurvivesDisconnectKill(t *testing.T) {
	for _, mode := range []struct {
		name string
		tree bool
	}{{"group", false}, {"tree", true}} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, spritestest.Options{KillTree: mode.tree, IdleAfter: -1})
			root := installShim(t, f, "dc")
			ctx := ctxFor(t)
			dir, _ := f.srv.Dir("dc")
			marker := filepath.Join(t.TempDir(), "direct")
			// The session writes after the kill (1.5 s in; the kill comes
			// 200 ms after the disconnect).
			session := `sleep 1.5; printf 'a\000b'; echo tail; exit 7`
			// The stand-in maps argv[0] into the sprite; inside a shell
			// script the host path is spelled out.
			script := filepath.Join(dir, shimPath) + ` --root ` + root + ` spawn -- /bin/sh -c "` + session + `"; ` +
				`/bin/sh -c "sleep 1.5; echo done > ` + marker + `" & ` +
				`exec sleep 60`
			ectx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			s, err := f.c.Exec(ectx, "dc", sprites.ExecOptions{Argv: []string{"/bin/sh", "-c", script},
				MaxRunAfterDisconnect: 200 * time.Millisecond})
			if err != nil {
				t.Fatalf("exec: %v", err)
			}
			var out, errOut []byte
			for !strings.Contains(string(out), "\n") {
				ev, err := s.Recv(ectx)
				if err != nil {
					t.Fatalf("recv before the id: %v (stdout %q stderr %q)", err, out, errOut)
				}
				if ev.Kind == sprites.EventExit {
					t.Fatalf("exec exited %d before disconnect (stdout %q)", ev.ExitCode, out)
				}
				switch ev.Kind {
				case sprites.EventStdout:
					out = append(out, ev.Data...)
				case sprites.EventStderr:
					errOut = append(errOut, ev.Data...)
				}
			}
			id := strings.TrimSpace(string(out))
			_ = s.Close()
			t.Cleanup(func() {
				_, _ = f.c.Run(ctxFor(t), "dc", sprites.ExecOptions{Argv: []string{shimPath, "--root", root, "terminate", "--grace", "1s", id}}, nil)
			})
			att, err := f.c.Run(ctx, "dc", sprites.ExecOptions{Argv: []string{shimPath, "--root", root, "attach", "--text", id}}, nil)
			if err != nil {
				t.Fatalf("attach: %v", err)
			}
			if string(att.Stdout) != "a\x00btail\n" || att.ExitCode != 7 {
				t.Errorf("session after the %s kill: stdout %q exit %d (stderr %q); want %q and 7",
					mode.name, att.Stdout, att.ExitCode, att.Stderr, "a\x00btail\n")
			}
			// The control: the directly started command had its 1.5 s too,
			// and the kill reached it.
			time.Sleep(500 * time.Millisecond)
			if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the command started directly from the exec survived the %s kill (stat: %v): the kill reached nothing", mode.name, err)
			}
		})
	}
}
