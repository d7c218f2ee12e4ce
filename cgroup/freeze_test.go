package cgroup

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestV1FreezeStopsEveryProcess runs a counter that writes a file in a
// loop: while frozen the file stops changing, after thaw it moves again.
func TestV1FreezeStopsEveryProcess(t *testing.T) {
	m := newTestManager(t, ModeV1)
	if err := m.CanFreeze(); err != nil {
		t.Fatalf("CanFreeze = %v on a host with the v1 freezer mounted", err)
	}
	ensure(t, m, "sb", Limits{})
	dirs := sessionDirs(t, m, "sb", "s1")
	dirOf(t, dirs, "freezer") // sessions are placed in the freezer too
	out := filepath.Join(t.TempDir(), "n")
	startIn(t, dirs, "sh", "-c", `i=0; while :; do i=$((i+1)); echo $i > `+out+`.tmp; mv `+out+`.tmp `+out+`; done`)
	read := func() int {
		for {
			b, err := os.ReadFile(out)
			if err == nil {
				if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
					return n
				}
			}
			time.Sleep(time.Millisecond)
		}
	}
	for read() < 10 {
	}
	thaw, err := m.Freeze(context.Background(), "sb")
	if err != nil {
		t.Fatal(err)
	}
	a := read()
	time.Sleep(200 * time.Millisecond)
	if b := read(); b != a {
		t.Errorf("counter moved from %d to %d while frozen", a, b)
	}
	if err := thaw(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for read() == a {
		if time.Now().After(deadline) {
			t.Fatal("counter did not move after thaw")
		}
		time.Sleep(time.Millisecond)
	}
	if err := m.Remove(context.Background(), "sb"); err != nil {
		t.Fatal(err)
	}
}

// TestFreezeForkLoop freezes a cgroup that forks as fast as it can, many
// times over: the v1 freezer misses tasks forked mid-freeze and would
// read FREEZING for good without Freeze's re-write and re-freeze.
func TestFreezeForkLoop(t *testing.T) {
	m := newTestManager(t, ModeV1)
	ensure(t, m, "fork", Limits{})
	dirs := sessionDirs(t, m, "fork", "s1")
	for range 4 {
		startIn(t, dirs, "sh", "-c", `while :; do /bin/true; done`)
	}
	time.Sleep(50 * time.Millisecond)
	for i := range 60 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		start := time.Now()
		thaw, err := m.Freeze(ctx, "fork")
		cancel()
		if err != nil {
			t.Fatalf("freeze %d: %v after %v", i, err, time.Since(start))
		}
		if err := thaw(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(i%7) * time.Millisecond)
	}
	if err := m.Remove(context.Background(), "fork"); err != nil {
		t.Fatal(err)
	}
}
