package journal

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestRelocate: a journal created in a staging directory that is renamed
// before any write keeps working at its new place: new segments, the exit
// record and every sync land there, and a reader there sees every byte.
func TestRelocate(t *testing.T) {
	root := t.TempDir()
	stage, final := filepath.Join(root, "stage"), filepath.Join(root, "final")
	w := mustCreate(t, filepath.Join(stage, "j"), Options{Streams: []string{"stdout"}, SegmentBytes: 4096})
	other := mustCreate(t, filepath.Join(root, "other"), Options{Streams: []string{"stdout"}})

	if err := os.Rename(stage, final); err != nil {
		t.Fatal(err)
	}
	if err := w.Relocate(filepath.Join(root, "other")); err == nil {
		t.Fatal("Relocate to another journal's directory: got nil, want an error")
	}
	if err := w.Relocate(filepath.Join(root, "missing")); err == nil {
		t.Fatal("Relocate to a missing directory: got nil, want an error")
	}
	if err := w.Relocate(filepath.Join(final, "j")); err != nil {
		t.Fatalf("Relocate: %v", err)
	}
	want := patternBytes(0, 0, 3*4096+100) // rolls three segments at the new place
	if _, err := w.Write("stdout", want); err != nil {
		t.Fatal(err)
	}
	if err := w.Finish(Exit{Reason: ReasonExited, Code: 3}); err != nil {
		t.Fatal(err)
	}
	other.Close()

	if _, err := os.Stat(stage); !os.IsNotExist(err) {
		t.Fatalf("staging directory: got %v, want it gone (nothing written at the old place)", err)
	}
	j := mustOpen(t, filepath.Join(final, "j"))
	if got := readRange(t, j, "stdout", 0); !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes, want %d, equal %v", len(got), len(want), bytes.Equal(got, want))
	}
	if e, ok, err := j.Exit(); err != nil || !ok || e.Code != 3 {
		t.Fatalf("exit: %+v %v %v, want exited 3", e, ok, err)
	}
}
