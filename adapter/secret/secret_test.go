package secret_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/agentrunner/runner/adapter/secret"
)

const value = "tok_TOPSECRET_0123456789"

// holder keeps a Secret in an unexported field: fmt does not call methods
// there, so only Secret's layout protects the value.
type holder struct {
	Exported secret.Secret
	hidden   secret.Secret
	ptr      *secret.Secret
}

func TestRevealAndZero(t *testing.T) {
	s := secret.New(value)
	if got := s.Reveal(); got != value {
		t.Fatalf("Reveal: got %q, want %q", got, value)
	}
	if s.IsZero() {
		t.Fatal("IsZero of a set secret: got true")
	}
	for _, z := range []secret.Secret{{}, secret.New("")} {
		if !z.IsZero() || z.Reveal() != "" {
			t.Fatalf("zero secret: IsZero=%v Reveal=%q, want true and \"\"", z.IsZero(), z.Reveal())
		}
	}
}

// TestEveryRenderingRedacted renders a Secret, a pointer to one and a struct
// holding it (exported, unexported, by pointer) every way a log line could.
func TestEveryRenderingRedacted(t *testing.T) {
	s := secret.New(value)
	h := holder{Exported: s, hidden: s, ptr: &s}
	hexValue := fmt.Sprintf("%x", value)
	var rendered []string
	for _, v := range []any{s, &s, h, &h} {
		for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d", "%T %v", "%!"} {
			rendered = append(rendered, fmt.Sprintf(verb, v))
		}
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatalf("json.Marshal(%T): %v", v, err)
		}
		rendered = append(rendered, string(b))
		var buf bytes.Buffer
		slog.New(slog.NewJSONHandler(&buf, nil)).Info("x", "v", v)
		slog.New(slog.NewTextHandler(&buf, nil)).Info("x", "v", v)
		rendered = append(rendered, buf.String())
	}
	for _, r := range rendered {
		if strings.Contains(r, value) || strings.Contains(r, hexValue) || strings.Contains(r, strings.ToUpper(hexValue)) {
			t.Errorf("the value leaked into %q", r)
		}
	}
	// Exact forms of the direct renderings.
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%d"} {
		if got := fmt.Sprintf(verb, s); got != secret.Redacted {
			t.Errorf("Sprintf(%q): got %q, want %q", verb, got, secret.Redacted)
		}
	}
	if got := s.String(); got != secret.Redacted {
		t.Errorf("String: got %q", got)
	}
	if b, _ := json.Marshal(s); string(b) != `"[redacted]"` {
		t.Errorf("JSON: got %s", b)
	}
	if b, _ := s.MarshalText(); string(b) != secret.Redacted {
		t.Errorf("text: got %s", b)
	}
	var buf bytes.Buffer
	slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}})).Info("m", "k", s)
	if got, want := buf.String(), "level=INFO msg=m k=[redacted]\n"; got != want {
		t.Errorf("slog: got %q, want %q", got, want)
	}
}

func TestUnmarshalJSON(t *testing.T) {
	var v struct {
		Token secret.Secret `json:"token"`
	}
	if err := json.Unmarshal([]byte(`{"token":"`+value+`"}`), &v); err != nil {
		t.Fatal(err)
	}
	if got := v.Token.Reveal(); got != value {
		t.Fatalf("decoded: got %q, want %q", got, value)
	}
	if err := json.Unmarshal([]byte(`{"token":null}`), &v); err != nil {
		t.Fatal(err)
	}
	if !v.Token.IsZero() {
		t.Fatal("null: want the zero secret")
	}
	if err := json.Unmarshal([]byte(`{"token":""}`), &v); err != nil || !v.Token.IsZero() {
		t.Fatalf(`"": err=%v zero=%v, want nil and true`, err, v.Token.IsZero())
	}
	var typeErr *json.UnmarshalTypeError
	err := json.Unmarshal([]byte(`{"token":42}`), &v)
	if err == nil || !errors.As(err, &typeErr) {
		t.Fatalf("a number: got %v, want a *json.UnmarshalTypeError", err)
	}
}

func TestRedact(t *testing.T) {
	a, b := secret.New("tok-aaa"), secret.New("key-bbb")
	got := secret.Redact("GET /x?t=tok-aaa failed: key-bbb, tok-aaa again", a, b, secret.Secret{}, secret.New(""))
	if want := "GET /x?t=[redacted] failed: [redacted], [redacted] again"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	if got := secret.Redact("nothing here"); got != "nothing here" {
		t.Fatalf("no secrets: got %q", got)
	}
}
