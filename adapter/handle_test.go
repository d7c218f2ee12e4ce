package adapter

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

type secretBag struct{ Token string }

func TestPrivateNeverPrinted(t *testing.T) {
	const secret = "sk-live-4f9a1c-DO-NOT-LEAK"
	h := Handle{Provider: "p", Name: "n", ID: "i1", Private: NewPrivate(&secretBag{Token: secret})}
	hp := &h
	var outputs []string
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d", "%T"} {
		outputs = append(outputs, fmt.Sprintf(verb, h), fmt.Sprintf(verb, hp), fmt.Sprintf(verb, h.Private))
	}
	outputs = append(outputs, fmt.Sprint(h), fmt.Sprintln(h), h.String(), h.Private.String(), h.Private.GoString(),
		fmt.Errorf("destroy %v: %w", h, errors.New("x")).Error(),
		fmt.Sprintf("%v", []Handle{h}), fmt.Sprintf("%+v", map[string]Handle{"a": h}),
		fmt.Sprintf("%+v", struct{ H Handle }{h}))
	for _, mk := range []func(*bytes.Buffer) slog.Handler{
		func(b *bytes.Buffer) slog.Handler { return slog.NewTextHandler(b, nil) },
		func(b *bytes.Buffer) slog.Handler { return slog.NewJSONHandler(b, nil) },
	} {
		var buf bytes.Buffer
		l := slog.New(mk(&buf))
		l.Info("created", "handle", h, "ptr", hp, "private", h.Private, "any", any(h.Private))
		l.Info("group", slog.Any("h", struct{ H Handle }{h}))
		outputs = append(outputs, buf.String())
	}
	j, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	jp, err := json.Marshal(h.Private)
	if err != nil {
		t.Fatal(err)
	}
	outputs = append(outputs, string(j), string(jp))
	for _, out := range outputs {
		if strings.Contains(out, secret) || strings.Contains(out, "sk-live") {
			t.Errorf("secret leaked: %s", out)
		}
	}
	if got := h.Private.Value().(*secretBag).Token; got != secret {
		t.Errorf("Value().Token = %q, want the secret back", got)
	}
}

func TestHandleSame(t *testing.T) {
	a := Handle{Provider: "p", Name: "n", ID: "1", Private: NewPrivate(1)}
	b := Handle{Provider: "p", Name: "n", ID: "1", Private: NewPrivate(2)}
	c := Handle{Provider: "p", Name: "n", ID: "2"}
	if !a.Same(b) {
		t.Errorf("%v.Same(%v) = false, want true", a, b)
	}
	if a.Same(c) {
		t.Errorf("%v.Same(%v) = true, want false (another incarnation)", a, c)
	}
}
