package main

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/agentrunner/runner/adapter/guest/guestproto"
	"github.com/agentrunner/runner/version"
	"github.com/agentrunner/runner/wire"
)

// sessionsJSON is a list page as runner-shim's session objects carry it:
// every field set, so nothing the protocol type leaves out goes unseen.
const sessionsJSON = `{"sessions":[{"id":"s1","state":"exited","shim_pid":10,"pid":11,"tty":true,` +
	`"exit":{"reason":"exited","code":3,"lengths":{"stdout":5},"time":"2026-01-02T03:04:05.000000006Z","terminated":true},` +
	`"write_error":"disk full","started_at":"2026-01-02T03:04:00Z","descendants":2,"argv":["sh","-c","x"],"cwd":"/w","stdout":5,"stderr":1}]}`

// oldLine is the answer line as runner-shim wrote it from a map (before
// the protocol had types): the golden bytes.
func oldLine(fields map[string]any) []byte {
	fields["version"] = version.String()
	b, _ := json.Marshal(fields)
	return append(b, '\n')
}

// TestAnswerLinesUnchanged: every answer runner-shim prints, built from
// guestproto's types over its own session objects, has the bytes of the
// map it was built from before.
func TestAnswerLinesUnchanged(t *testing.T) {
	var page reply
	if err := json.Unmarshal([]byte(sessionsJSON), &page); err != nil || len(page.Sessions) != 1 {
		t.Fatalf("decode the page: %v", err)
	}
	in := page.Sessions[0]
	exit := *in.Exit
	we := wire.Exit{Reason: exit.Reason, Code: exit.Code, Lengths: exit.Lengths, Time: exit.Time, Terminated: exit.Terminated}
	created, again, n := true, false, 0
	for _, tc := range []struct {
		name  string
		typed reply
		old   map[string]any
	}{
		{"version", reply{}, map[string]any{}},
		{"spawn", reply{ID: in.ID, Created: &created, Session: &in}, map[string]any{"id": in.ID, "created": created, "session": in}},
		{"spawn again", reply{ID: in.ID, Created: &again, Session: &in}, map[string]any{"id": in.ID, "created": again, "session": in}},
		{"status", reply{Session: &in}, map[string]any{"session": in}},
		{"write", reply{ID: "s1", OK: true, Written: &n}, map[string]any{"id": "s1", "ok": true, "written": n}},
		{"signal", reply{ID: "s1", OK: true}, map[string]any{"id": "s1", "ok": true}},
		{"terminate", reply{ID: "s1", Exit: &we}, map[string]any{"id": "s1", "exit": we}},
		{"list", reply{Sessions: page.Sessions}, map[string]any{"sessions": page.Sessions}},
		{"list empty", reply{Sessions: page.Sessions[:0]}, map[string]any{"sessions": page.Sessions[:0]}},
		{"list more", reply{Sessions: page.Sessions, More: true}, map[string]any{"sessions": page.Sessions, "more": true}},
		{"usage", reply{Error: &guestproto.Error{Error: wire.Error{Code: wire.CodeInvalid, Detail: "no id"}}},
			map[string]any{"error": wire.Error{Code: wire.CodeInvalid, Detail: "no id"}}},
		{"fail", reply{Error: &guestproto.Error{Error: wire.Error{Code: wire.CodeInvalid, Detail: "exec"}, ExecError: execErrorOf(wire.ShimExitExecNotFound)}},
			map[string]any{"error": struct {
				wire.Error
				ExecError string `json:"exec_error,omitempty"`
			}{wire.Error{Code: wire.CodeInvalid, Detail: "exec"}, "not_found"}}},
	} {
		if got, want := answerLine(tc.typed), oldLine(tc.old); !bytes.Equal(got, want) {
			t.Errorf("%s: got %s want %s", tc.name, got, want)
		}
	}
}

// TestProtocolInfoReadsEverySessionField: the protocol's session object
// (what adapters read) knows every field runner-shim writes, with the
// same values.
func TestProtocolInfoReadsEverySessionField(t *testing.T) {
	var page reply
	if err := json.Unmarshal([]byte(sessionsJSON), &page); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(page.Sessions[0])
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	var got guestproto.Info
	if err := d.Decode(&got); err != nil {
		t.Fatalf("guestproto.Info cannot read runner-shim's %s: %v", b, err)
	}
	if got.ID != "s1" || got.State != "exited" || got.ShimPID != 10 || got.PID != 11 || !got.TTY || got.Exit == nil ||
		got.Exit.Code != 3 || !got.Exit.Terminated || got.WriteError != "disk full" || got.Descendants != 2 ||
		len(got.Argv) != 3 || got.Cwd != "/w" || got.Stdout != 5 || got.Stderr != 1 || got.StartedAt.IsZero() {
		t.Errorf("got %+v from %s", got, b)
	}
}
