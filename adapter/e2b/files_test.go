package e2b_test

import (
	"bytes"
	"crypto/rand"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/e2b"
	"github.com/agentrunner/runner/adapter/e2b/e2btest"
)

func TestWriteReadFile(t *testing.T) {
	s := newSandbox(t, e2btest.Options{})
	ctx := ctxFor(t)
	want := make([]byte, 2<<20+3)
	if _, err := rand.Read(want); err != nil {
		t.Fatal(err)
	}
	if err := s.envd.WriteFile(ctx, "bin/blob", bytes.NewReader(want)); err != nil {
		t.Fatalf("write file: %v", err)
	}
	got, err := s.envd.ReadFile(ctx, "bin/blob")
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read file: %d bytes, %v; want the %d written", len(got), err, len(want))
	}
	if err := s.envd.WriteFile(ctx, filepath.Join(s.dir, "bin/blob"), bytes.NewReader([]byte("short"))); err != nil {
		t.Fatalf("overwrite by absolute path: %v", err)
	}
	if got, _ := os.ReadFile(filepath.Join(s.dir, "bin", "blob")); string(got) != "short" {
		t.Errorf("after overwrite the file holds %d bytes, want %q", len(got), "short")
	}

	// An uploaded program runs once a process made it executable.
	if err := s.envd.WriteFile(ctx, "bin/hello", bytes.NewReader([]byte("#!/bin/sh\necho hello from $0\n"))); err != nil {
		t.Fatal(err)
	}
	for _, req := range []e2b.StartRequest{argv("chmod", "+x", "bin/hello"), argv("./bin/hello")} {
		st, err := s.envd.Start(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		out, err := st.Drain()
		if err != nil || out.End.ExitCode != 0 {
			t.Fatalf("%s: %+v %v", req.Process.Cmd, out.End, err)
		}
		if req.Process.Cmd == "./bin/hello" && string(out.Stdout) != "hello from ./bin/hello\n" {
			t.Errorf("uploaded program printed %q", out.Stdout)
		}
	}

	_, err = s.envd.ReadFile(ctx, "no/such/file")
	var e *e2b.Error
	if !errors.As(err, &e) || e.Status != http.StatusNotFound || adapter.KindOf(err) != adapter.KindProvider {
		t.Errorf("read of a missing file: got %v, want Status 404 of kind provider (a file, not the sandbox)", err)
	}
}

// TestFilePathsStayInTheSandbox attacks the stand-in's confinement: its
// files API writes on the host, so a path must not leave the sandbox's
// directory by "..", by an absolute path or through a symlink.
func TestFilePathsStayInTheSandbox(t *testing.T) {
	s := newSandbox(t, e2btest.Options{})
	ctx := ctxFor(t)
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(s.dir, "link")); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"../escaped", filepath.Join(outside, "abs"), "link/through", "link/../../escaped2"} {
		err := s.envd.WriteFile(ctx, p, bytes.NewReader([]byte("x")))
		wantKind(t, "write to "+p, err, adapter.KindInvalid)
		_, err = s.envd.ReadFile(ctx, p)
		if err == nil {
			t.Errorf("read of %s succeeded", p)
		}
	}
	entries, _ := os.ReadDir(outside)
	parent, _ := os.ReadDir(filepath.Dir(s.dir))
	if len(entries) != 0 {
		t.Errorf("files appeared outside the sandbox: %v", entries)
	}
	for _, e := range parent {
		if e.Name() == "escaped" || e.Name() == "escaped2" {
			t.Errorf("file %s escaped next to the sandbox directory", e.Name())
		}
	}
}
