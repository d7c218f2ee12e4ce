package guestproto_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter/guest/guestproto"
	"github.com/agentrunner/runner/wire"
)

// session stands in for runner-shim's session object.
type session struct {
	ID    string `json:"id"`
	State string `json:"state"`
}

func ptr[T any](v T) *T { return &v }

// TestAnswerBytes: every answer runner-shim prints has the bytes it had
// when runner-shim built it as a map[string]any (the golden line), so a
// reader of either vintage reads the other.
func TestAnswerBytes(t *testing.T) {
	exit := wire.Exit{Reason: "exited", Code: 3, Time: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)}
	s1 := session{ID: "s1", State: "running"}
	for _, tc := range []struct {
		name   string
		typed  guestproto.Answer[session]
		old    map[string]any
		golden string
	}{
		{"version", guestproto.Answer[session]{}, map[string]any{}, `{"version":"v1"}`},
		{"spawn created", guestproto.Answer[session]{ID: "s1", Created: ptr(true), Session: &s1},
			map[string]any{"id": "s1", "created": true, "session": s1},
			`{"created":true,"id":"s1","session":{"id":"s1","state":"running"},"version":"v1"}`},
		{"spawn again", guestproto.Answer[session]{ID: "s1", Created: ptr(false), Session: &s1},
			map[string]any{"id": "s1", "created": false, "session": s1},
			`{"created":false,"id":"s1","session":{"id":"s1","state":"running"},"version":"v1"}`},
		{"status", guestproto.Answer[session]{Session: &s1}, map[string]any{"session": s1},
			`{"session":{"id":"s1","state":"running"},"version":"v1"}`},
		{"write", guestproto.Answer[session]{ID: "s1", OK: true, Written: ptr(0)},
			map[string]any{"id": "s1", "ok": true, "written": 0}, `{"id":"s1","ok":true,"version":"v1","written":0}`},
		{"close-stdin", guestproto.Answer[session]{ID: "s1", OK: true}, map[string]any{"id": "s1", "ok": true},
			`{"id":"s1","ok":true,"version":"v1"}`},
		{"terminate", guestproto.Answer[session]{ID: "s1", Exit: &exit}, map[string]any{"id": "s1", "exit": exit},
			`{"exit":{"reason":"exited","code":3,"time":"2026-01-02T03:04:05.000000006Z"},"id":"s1","version":"v1"}`},
		{"list empty", guestproto.Answer[session]{Sessions: []session{}}, map[string]any{"sessions": []session{}},
			`{"sessions":[],"version":"v1"}`},
		{"list page", guestproto.Answer[session]{Sessions: []session{s1}, More: true},
			map[string]any{"sessions": []session{s1}, "more": true},
			`{"more":true,"sessions":[{"id":"s1","state":"running"}],"version":"v1"}`},
		{"usage error", guestproto.Answer[session]{Error: &guestproto.Error{Error: wire.Error{Code: wire.CodeInvalid, Detail: "no id"}}},
			map[string]any{"error": wire.Error{Code: wire.CodeInvalid, Detail: "no id"}},
			`{"error":{"code":"invalid","detail":"no id"},"version":"v1"}`},
		{"exec error", guestproto.Answer[session]{Error: &guestproto.Error{Error: wire.Error{Code: wire.CodeInvalid, Detail: "no such program"}, ExecError: guestproto.ExecNotFound}},
			map[string]any{"error": struct {
				wire.Error
				ExecError string `json:"exec_error,omitempty"`
			}{wire.Error{Code: wire.CodeInvalid, Detail: "no such program"}, "not_found"}},
			`{"error":{"code":"invalid","detail":"no such program","exec_error":"not_found"},"version":"v1"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.typed.Version = "v1"
			tc.old["version"] = "v1"
			typed, err := json.Marshal(tc.typed)
			if err != nil {
				t.Fatal(err)
			}
			old, _ := json.Marshal(tc.old)
			if string(old) != tc.golden {
				t.Fatalf("the map's bytes: got %s, want %s (the golden line is wrong)", old, tc.golden)
			}
			if string(typed) != tc.golden {
				t.Errorf("got %s, want %s", typed, tc.golden)
			}
			var back guestproto.Answer[session]
			if err := json.Unmarshal(typed, &back); err != nil {
				t.Fatal(err)
			}
			again, _ := json.Marshal(back)
			if string(again) != tc.golden {
				t.Errorf("read and written again: got %s, want %s", again, tc.golden)
			}
		})
	}
}
