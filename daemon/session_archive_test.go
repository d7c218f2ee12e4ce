package daemon_test

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentrunner/runner/wire"
)

// exportSessions fetches sandbox's session archive and wants 200.
func (a *api) exportSessions(sandbox string) []byte {
	a.t.Helper()
	r := a.raw("GET", "/v1/sandboxes/"+sandbox+"/session-archive", nil)
	if r.status != 200 || r.header.Get("Content-Type") != wire.ContentTypeSessionArchive {
		a.t.Fatalf("export sessions of %s: got %d %q %.300q, want 200 %s", sandbox, r.status, r.header.Get("Content-Type"), r.body, wire.ContentTypeSessionArchive)
	}
	return r.body
}

// stateSessionDirs counts the session directories under the state's s/.
func stateSessionDirs(t *testing.T, state string) int {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(state, "s"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".warm-") {
			n++
		}
	}
	return n
}

// TestSessionArchive moves a sandbox's ended sessions from one runnerd to
// another: same ids, exits and requests, journals byte-exact from byte 0;
// a running session refuses the export; a second import is a conflict.
func TestSessionArchive(t *testing.T) {
	a, b := startDaemon(t), startDaemon(t)
	a.createSandbox("mv")
	s1 := a.spawn("mv", wire.CreateSession{ID: "s1", Argv: []string{"sh", "-c", "printf 'out\\000put'; printf err >&2; exit 7"}})
	s2 := a.spawn("mv", wire.CreateSession{ID: "s2", TTY: true, Argv: []string{"sh", "-c", "echo tty; kill -TERM $$"}})
	e1, e2 := a.waitEnded("mv", s1.ID), a.waitEnded("mv", s2.ID)
	if e1.Exit == nil || e1.Exit.Code != 7 || e2.Exit == nil || e2.Exit.Reason != wire.ExitSignaled {
		t.Fatalf("exits: got %+v and %+v, want code 7 and signaled", e1.Exit, e2.Exit)
	}

	// A sandbox with a session running is refused, before any byte.
	a.createSandbox("busy")
	run := a.spawn("busy", wire.CreateSession{ID: "r", Argv: []string{"sleep", "60"}})
	a.wantError(a.raw("GET", "/v1/sandboxes/busy/session-archive", nil), 409, wire.CodeInvalid)
	a.must("POST", "/v1/sandboxes/busy/sessions/"+run.ID+"/terminate", nil, 200, nil)

	arc := a.exportSessions("mv")
	b.createSandbox("mv")
	var got wire.SessionImport
	r := b.raw("POST", "/v1/sandboxes/mv/session-archive", bytes.NewReader(arc))
	if r.status != 201 {
		t.Fatalf("import: got %d %s, want 201", r.status, r.body)
	}
	if err := json.Unmarshal(r.body, &got); err != nil || len(got.Sessions) != 2 {
		t.Fatalf("import answer %s: %v, want 2 sessions", r.body, err)
	}
	for _, want := range []wire.Session{e1, e2} {
		var s wire.Session
		b.must("GET", "/v1/sandboxes/mv/sessions/"+want.ID, nil, 200, &s)
		if s.State != want.State || s.Exit == nil || s.Exit.Reason != want.Exit.Reason || s.Exit.Code != want.Exit.Code || s.Exit.Signal != want.Exit.Signal || s.TTY != want.TTY {
			t.Fatalf("session %s on B: got %+v exit %+v, want %+v exit %+v", want.ID, s, s.Exit, want, want.Exit)
		}
		if !s.Exit.Time.Equal(want.Exit.Time) || !maps.Equal(s.Exit.Lengths, want.Exit.Lengths) || !s.StartedAt.Equal(want.StartedAt) {
			t.Fatalf("session %s on B: exit %+v started %s, want exit %+v started %s", want.ID, s.Exit, s.StartedAt, want.Exit, want.StartedAt)
		}
		for _, st := range []string{"stdout", "stderr"} {
			if want.TTY && st == "stderr" {
				continue
			}
			ra := a.do("GET", "/v1/sandboxes/mv/sessions/"+want.ID+"/streams/"+st, nil)
			rb := b.do("GET", "/v1/sandboxes/mv/sessions/"+want.ID+"/streams/"+st, nil)
			if rb.status != 200 || !bytes.Equal(ra.body, rb.body) || len(ra.body) == 0 {
				t.Fatalf("session %s %s on B: got %d %q, want 200 %q (A's)", want.ID, st, rb.status, rb.body, ra.body)
			}
		}
	}
	var sb wire.Session
	b.must("GET", "/v1/sandboxes/mv/sessions/s1", nil, 200, &sb)
	if rb := b.do("GET", "/v1/sandboxes/mv/sessions/s1/streams/stdout", nil); string(rb.body) != "out\x00put" {
		t.Fatalf("s1 stdout on B: got %q, want %q", rb.body, "out\x00put")
	}

	// The same archive again: the ids are taken, nothing changes.
	before := stateSessionDirs(t, b.state)
	b.wantError(b.raw("POST", "/v1/sandboxes/mv/session-archive", bytes.NewReader(arc)), 409, wire.CodeInvalid)
	if after := stateSessionDirs(t, b.state); after != before {
		t.Fatalf("session directories after a refused import: got %d, want %d", after, before)
	}
	// Into a sandbox that does not exist: not_found, from the registry.
	b.wantError(b.raw("POST", "/v1/sandboxes/nosuch/session-archive", bytes.NewReader(arc)), 404, wire.CodeNotFound)
}

// rewriteArchive rebuilds a session archive, letting edit change each
// entry (its header and body) or drop it (false), and add appended.
func rewriteArchive(t *testing.T, arc []byte, edit func(h *tar.Header, body []byte) ([]byte, bool), extra ...func(tw *tar.Writer)) []byte {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(arc))
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		body, keep := edit(h, body)
		if !keep {
			continue
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(body); err != nil {
			t.Fatal(err)
		}
	}
	for _, fn := range extra {
		fn(tw)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// TestSessionArchiveHostile feeds runnerd (root) archives made to escape
// or to lie: each is refused invalid and leaves no record and no file.
func TestSessionArchiveHostile(t *testing.T) {
	a, b := startDaemon(t), startDaemon(t)
	a.createSandbox("src")
	s := a.spawn("src", wire.CreateSession{ID: "s1", Argv: []string{"sh", "-c", "echo hello; exit 3"}})
	a.waitEnded("src", s.ID)
	arc := a.exportSessions("src")
	b.createSandbox("dst")
	victim := filepath.Join(t.TempDir(), "victim")
	keepAll := func(h *tar.Header, body []byte) ([]byte, bool) { return body, true }
	manifest := func(fn func(m map[string]any)) func(h *tar.Header, body []byte) ([]byte, bool) {
		return func(h *tar.Header, body []byte) ([]byte, bool) {
			if h.Name != "sessions.json" {
				return body, true
			}
			var m map[string]any
			if err := json.Unmarshal(body, &m); err != nil {
				t.Fatal(err)
			}
			fn(m)
			out, _ := json.Marshal(m)
			return out, true
		}
	}
	sess0 := func(m map[string]any) map[string]any { return m["sessions"].([]any)[0].(map[string]any) }
	cases := []struct {
		name string
		arc  []byte
	}{
		{"symlink entry", rewriteArchive(t, arc, keepAll, func(tw *tar.Writer) {
			tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "s1/journal/stdout/99999999999999999999.seg", Linkname: victim})
		})},
		{"path out of the journal", rewriteArchive(t, arc, keepAll, func(tw *tar.Writer) {
			body := []byte("pwned")
			tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "s1/journal/stdout/" + strings.Repeat("../", 40) + strings.TrimPrefix(victim, "/"), Size: int64(len(body)), Mode: 0o644})
			tw.Write(body)
		})},
		{"a file no journal has", rewriteArchive(t, arc, keepAll, func(tw *tar.Writer) {
			tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "s1/journal/spec.json", Size: 2, Mode: 0o644})
			tw.Write([]byte("{}"))
		})},
		{"a hard link", rewriteArchive(t, arc, keepAll, func(tw *tar.Writer) {
			tw.WriteHeader(&tar.Header{Typeflag: tar.TypeLink, Name: "s1/journal/stderr/00000000000000000009.seg", Linkname: "/etc/shadow"})
		})},
		{"a session the manifest does not list", rewriteArchive(t, arc, func(h *tar.Header, body []byte) ([]byte, bool) {
			h.Name = strings.Replace(h.Name, "s1/", "s9/", 1)
			return body, true
		})},
		{"exit code the journal does not hold", rewriteArchive(t, arc, manifest(func(m map[string]any) {
			sess0(m)["exit"].(map[string]any)["code"] = 0
		}))},
		{"running session", rewriteArchive(t, arc, manifest(func(m map[string]any) { sess0(m)["state"] = "running" }))},
		{"bad id", rewriteArchive(t, arc, manifest(func(m map[string]any) { sess0(m)["id"] = "../x" }))},
		{"other version", rewriteArchive(t, arc, manifest(func(m map[string]any) { m["version"] = 2 }))},
		{"a segment missing", rewriteArchive(t, arc, func(h *tar.Header, body []byte) ([]byte, bool) {
			return body, !strings.HasSuffix(h.Name, ".seg") || !strings.Contains(h.Name, "stdout")
		})},
		{"cut short", arc[:len(arc)/2]},
		{"not a tar", []byte("RUNNERCK not a session archive")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := stateSessionDirs(t, b.state)
			b.wantError(b.raw("POST", "/v1/sandboxes/dst/session-archive", bytes.NewReader(tc.arc)), 400, wire.CodeInvalid)
			var list wire.SessionList
			b.must("GET", "/v1/sandboxes/dst/sessions", nil, 200, &list)
			if len(list.Sessions) != 0 {
				t.Fatalf("sessions after a refused import: %+v", list.Sessions)
			}
			if after := stateSessionDirs(t, b.state); after != before {
				t.Fatalf("session directories after a refused import: got %d, want %d", after, before)
			}
			if _, err := os.Lstat(victim); !os.IsNotExist(err) {
				t.Fatalf("%s exists after a refused import (err %v)", victim, err)
			}
		})
	}
	// The untouched archive imports.
	b.must("POST", "/v1/sandboxes/dst/session-archive", arc, 201, nil)
}
