package guest_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/guest"
)

// hostileShim is a "runner-shim" a hostile guest put in place: it answers
// the version check, then misbehaves by its name.
const hostileShim = `#!/bin/sh
case " $* " in
*" version "*) echo '{"version":"` + testVersion + `"}'; exit 0;;
*" attach "*) verb=attach;;
*" list "*) verb=list;;
*) exit 0;;
esac
case "$(basename "$0") $verb" in
"huge-header attach") printf '\325\001\001\001\000\000\000\000\000\000\000\000\377\377\377\377'; exec sleep 10;;
"endless-line attach") head -c 3000000 /dev/zero | tr '\0' 'A'; exec sleep 10;;
"flood list") head -c 20000000 /dev/zero | tr '\0' 'x';;
esac
`

// TestHostileGuest: a guest's runner-shim that lies cannot make the
// transport allocate what it says (a 4 GiB frame), hold an endless line,
// or make it keep an answer bigger than its bound (16 MiB); each is an error, at once.
func TestHostileGuest(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"huge-header", "endless-line", "flood"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(hostileShim), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		shim string
		text bool
		call func(g *guest.Guest) error
		want error
	}{
		{"huge-header", false, func(g *guest.Guest) error { _, err := g.Attach(ctxT(t), "s", adapter.Cursor{}); return err }, adapter.ErrUnavailable},
		{"endless-line", true, func(g *guest.Guest) error { _, err := g.Attach(ctxT(t), "s", adapter.Cursor{}); return err }, adapter.ErrUnavailable},
		{"flood", false, func(g *guest.Guest) error { _, err := g.Sessions(ctxT(t)); return err }, adapter.ErrProvider},
	} {
		t.Run(tc.shim, func(t *testing.T) {
			fx := newGuest(t, func(c *guest.Config, ex *localExec) { ex.bin = dir; c.Shim = tc.shim; c.TextSafe = tc.text })
			start := time.Now()
			err := tc.call(fx.g)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			// The hostile attaches sleep 10s after their bytes: the
			// transport must judge the bytes, not wait for the end. (The
			// flood's cost is the copy; its defence is the bound.)
			if el := time.Since(start); tc.shim != "flood" && el > 5*time.Second {
				t.Fatalf("took %v: the transport waited for the hostile process instead of refusing its bytes", el)
			}
		})
	}
}
