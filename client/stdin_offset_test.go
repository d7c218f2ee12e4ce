package client_test

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
)

// TestWriteStdinAt: against a real runnerd, an empty write at 0 answers
// the count; a write at the count is written, one behind it skips what
// arrived (all of it, or a prefix), one past it is adapter.ErrInvalid and
// writes nothing; a negative offset never leaves the client. cat copies
// each byte once.
func TestWriteStdinAt(t *testing.T) {
	d := startDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, a := newAdapter(t, d, d.url())
	h, err := a.Create(ctx, "offsets", adapter.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Destroy(ctx, h)
	st, err := a.Spawn(ctx, h, adapter.Shell("exec cat"), adapter.SpawnOptions{SessionID: "s"})
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	at := func(off int64, p string, want int64) {
		t.Helper()
		if n, err := c.WriteStdinAt(ctx, h.Name, "s", off, []byte(p)); err != nil || n != want {
			t.Fatalf("WriteStdinAt(%d, %q) = %d, %v; want %d", off, p, n, err, want)
		}
	}
	at(0, "", 0)
	at(0, "abc", 3)
	at(0, "abc", 3) // sent again: nothing written
	at(1, "bcd", 4) // "bc" arrived: "d" written
	_, err = c.WriteStdinAt(ctx, h.Name, "s", 9, []byte("x"))
	if !errors.Is(err, adapter.ErrInvalid) {
		t.Fatalf("WriteStdinAt past the count: %v, want adapter.ErrInvalid", err)
	}
	if _, err := c.WriteStdinAt(ctx, h.Name, "s", -1, []byte("x")); !errors.Is(err, adapter.ErrInvalid) {
		t.Fatalf("WriteStdinAt(-1): %v, want adapter.ErrInvalid", err)
	}
	if err := c.WriteStdin(ctx, h.Name, "s", []byte("e")); err != nil {
		t.Fatal(err)
	}
	at(5, "f", 6)
	if err := c.CloseStdin(ctx, h.Name, "s"); err != nil {
		t.Fatal(err)
	}
	body, err := c.Stream(ctx, h.Name, "s", "stdout", 0, true)
	if err != nil {
		t.Fatal(err)
	}
	defer body.Close()
	got, err := io.ReadAll(body)
	if err != nil || string(got) != "abcdef" {
		t.Fatalf("cat copied %q (%v), want %q", got, err, "abcdef")
	}
}
