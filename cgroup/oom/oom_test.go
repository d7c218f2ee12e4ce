package oom

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestKills(t *testing.T) {
	write := func(t *testing.T, dir, name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("v2", func(t *testing.T) {
		d := t.TempDir()
		write(t, d, "memory.events", "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n")
		got, err := Kills([]string{d})
		if err != nil || got != 2 {
			t.Fatalf("Kills = %d, %v; want 2, nil", got, err)
		}
	})
	t.Run("v1 among other hierarchies", func(t *testing.T) {
		pids, mem, cpu := t.TempDir(), t.TempDir(), t.TempDir()
		write(t, pids, "pids.max", "max\n")
		write(t, mem, "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 7\n")
		got, err := Kills([]string{pids, mem, cpu})
		if err != nil || got != 7 {
			t.Fatalf("Kills = %d, %v; want 7, nil", got, err)
		}
	})
	t.Run("no memory controller", func(t *testing.T) {
		got, err := Kills([]string{t.TempDir()})
		if !errors.Is(err, ErrNotSupported) {
			t.Fatalf("Kills = %d, %v; want ErrNotSupported", got, err)
		}
	})
	t.Run("counter missing", func(t *testing.T) {
		d := t.TempDir()
		write(t, d, "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\n")
		if got, err := Kills([]string{d}); err == nil {
			t.Fatalf("Kills = %d, nil; want an error for a file without oom_kill", got)
		}
	})
	t.Run("garbage", func(t *testing.T) {
		d := t.TempDir()
		write(t, d, "memory.events", "oom_kill many\n")
		if got, err := Kills([]string{d}); err == nil {
			t.Fatalf("Kills = %d, nil; want a parse error", got)
		}
	})
}
