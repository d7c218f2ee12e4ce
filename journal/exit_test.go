package journal

import (
	"os"
	"path/filepath"
	"testing"
)

// TestExitTerminated: the terminated marker survives Finish and a reopen,
// and an exit.json written before the field existed reads as not
// terminated (the format stays compatible).
func TestExitTerminated(t *testing.T) {
	tests := []struct {
		name string
		exit Exit
	}{
		{"terminated by signal", Exit{Reason: ReasonSignaled, Signal: 15, Code: 143, Terminated: true}},
		{"terminated, trapped and exited", Exit{Reason: ReasonExited, Code: 7, Terminated: true}},
		{"not terminated", Exit{Reason: ReasonSignaled, Signal: 15, Code: 143}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			w := mustCreate(t, dir, Options{Streams: []string{"stdout"}})
			if err := w.Finish(tt.exit); err != nil {
				t.Fatal(err)
			}
			j := mustOpen(t, dir)
			got, ok, err := j.Exit()
			if err != nil || !ok {
				t.Fatalf("Exit: ok %v err %v", ok, err)
			}
			if got.Terminated != tt.exit.Terminated || got.Code != tt.exit.Code || got.Signal != tt.exit.Signal {
				t.Errorf("got %+v, want terminated %v code %d signal %d", got, tt.exit.Terminated, tt.exit.Code, tt.exit.Signal)
			}
		})
	}

	t.Run("old exit.json", func(t *testing.T) {
		dir := t.TempDir()
		w := mustCreate(t, dir, Options{Streams: []string{"stdout"}})
		if err := w.Finish(Exit{Reason: ReasonSignaled, Signal: 9, Code: 137}); err != nil {
			t.Fatal(err)
		}
		old := `{"reason":"signaled","code":137,"signal":9,"lengths":{"stdout":0},"time":"2026-08-01T10:42:00Z"}`
		if err := os.WriteFile(filepath.Join(dir, "exit.json"), []byte(old), 0o600); err != nil {
			t.Fatal(err)
		}
		got, ok, err := mustOpen(t, dir).Exit()
		if err != nil || !ok || got.Terminated || got.Code != 137 {
			t.Fatalf("old record: got %+v ok %v err %v, want signaled 137, not terminated", got, ok, err)
		}
	})
}

// TestExitOOMKilled: the OOM marker survives Finish and a reopen with the
// signal it came with, and a record without the field reads false.
func TestExitOOMKilled(t *testing.T) {
	dir := t.TempDir()
	w := mustCreate(t, dir, Options{Streams: []string{"stdout"}})
	if err := w.Finish(Exit{Reason: ReasonSignaled, Signal: 9, Code: 137, OOMKilled: true}); err != nil {
		t.Fatal(err)
	}
	got, ok, err := mustOpen(t, dir).Exit()
	if err != nil || !ok || !got.OOMKilled || got.Reason != ReasonSignaled || got.Signal != 9 || got.Code != 137 {
		t.Fatalf("got %+v ok %v err %v, want signaled 9 137 oom_killed", got, ok, err)
	}
	old := `{"reason":"signaled","code":137,"signal":9,"lengths":{"stdout":0},"time":"2026-08-01T10:42:00Z","terminated":true}`
	if err := os.WriteFile(filepath.Join(dir, "exit.json"), []byte(old), 0o600); err != nil {
		t.Fatal(err)
	}
	got, ok, err = mustOpen(t, dir).Exit()
	if err != nil || !ok || got.OOMKilled || !got.Terminated {
		t.Fatalf("old record: got %+v ok %v err %v, want not oom_killed", got, ok, err)
	}
}
