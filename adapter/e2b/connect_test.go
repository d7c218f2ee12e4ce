package e2b

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

func TestEnvelopeRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	msgs := [][]byte{[]byte(`{"a":1}`), {}, bytes.Repeat([]byte{0}, 70000)}
	for _, m := range msgs {
		if err := writeEnvelope(&buf, 0, m); err != nil {
			t.Fatal(err)
		}
	}
	if err := writeEnvelope(&buf, flagEndStream, []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if got := buf.Bytes()[:5]; !bytes.Equal(got, []byte{0, 0, 0, 0, 7}) {
		t.Errorf("first header % x, want 00 00 00 00 07 (flags, big-endian length)", got)
	}
	for i, want := range msgs {
		flags, got, err := readEnvelope(&buf)
		if err != nil || flags != 0 || !bytes.Equal(got, want) {
			t.Fatalf("message %d: flags %#x, %d bytes, %v; want flags 0 and %d bytes", i, flags, len(got), err, len(want))
		}
	}
	flags, got, err := readEnvelope(&buf)
	if err != nil || flags != flagEndStream || string(got) != "{}" {
		t.Errorf("end-stream: flags %#x %q %v", flags, got, err)
	}
	if _, _, err := readEnvelope(&buf); err != io.EOF {
		t.Errorf("after the last envelope: %v, want io.EOF", err)
	}
}

func TestEnvelopeDefects(t *testing.T) {
	whole := appendEnvelope(nil, 0, []byte("hello"))
	for _, tc := range []struct {
		name string
		in   []byte
		want error
	}{
		{"cut inside the header", whole[:3], io.ErrUnexpectedEOF},
		{"cut inside the message", whole[:7], io.ErrUnexpectedEOF},
		{"cut right after the header", whole[:5], io.ErrUnexpectedEOF},
		{"oversized", []byte{0, 0x7f, 0, 0, 0}, errFrame},
		{"compressed", appendEnvelope(nil, flagCompressed, []byte("x")), errFrame},
		{"unknown flag", appendEnvelope(nil, 0x10, []byte("x")), errFrame},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := readEnvelope(bytes.NewReader(tc.in))
			if !errors.Is(err, tc.want) {
				t.Errorf("got %v, want %v", err, tc.want)
			}
		})
	}
	if err := writeEnvelope(io.Discard, 0, make([]byte, MaxMessageSize+1)); !errors.Is(err, errFrame) {
		t.Errorf("writing an oversized message: %v, want errFrame", err)
	}
}

func TestSandboxHosts(t *testing.T) {
	c, err := New(Config{APIKey: NewSecret("k"), Domain: "example.test"})
	if err != nil {
		t.Fatal(err)
	}
	if c.apiURL != "https://api.example.test" {
		t.Errorf("api URL %q, want https://api.example.test", c.apiURL)
	}
	if got := c.Envd(Sandbox{SandboxID: "isb"}).base; got != "https://49983-isb.example.test" {
		t.Errorf("envd URL %q, want https://49983-isb.example.test", got)
	}
	if got := c.Envd(Sandbox{SandboxID: "isb", Domain: "eu.example.test"}).base; got != "https://49983-isb.eu.example.test" {
		t.Errorf("envd URL %q, want the sandbox's own domain", got)
	}
	d, _ := New(Config{APIKey: NewSecret("k")})
	if d.apiURL != "https://api.e2b.app" {
		t.Errorf("default api URL %q, want https://api.e2b.app", d.apiURL)
	}
}
