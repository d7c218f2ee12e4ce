package guest_test

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/iotest"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/guest"
)

// TestReadStdin: up to max bytes come back whole; one byte more, or a
// stdin that fails to read, is *adapter.InvalidError and no bytes.
func TestReadStdin(t *testing.T) {
	tests := []struct {
		name    string
		stdin   io.Reader
		want    []byte
		invalid bool
	}{
		{"empty", bytes.NewReader(nil), []byte{}, false},
		{"at the bound", bytes.NewReader([]byte("12345678")), []byte("12345678"), false},
		{"one over", bytes.NewReader([]byte("123456789")), nil, true},
		{"read error", iotest.ErrReader(errors.New("pipe broke")), nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := guest.ReadStdin(tt.stdin, 8)
			var inv *adapter.InvalidError
			if tt.invalid != errors.As(err, &inv) || !tt.invalid && err != nil {
				t.Fatalf("got err %v, want invalid %v", err, tt.invalid)
			}
			if !bytes.Equal(got, tt.want) || (got == nil) != (tt.want == nil) {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
		})
	}
}
