package cgroup

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeV2 lays out a directory tree shaped like a cgroup2 hierarchy with
// memory, pids and cpu enabled (the files containerd's cgroup2 writes
// through must exist, as in the kernel) and returns a v2 backend on it.
// It is how the v2 limit and usage code is exercised on a host whose v2
// hierarchy has no controllers (this project's CI VM): it checks what is
// written and how it is read back, not what the kernel does with it.
func fakeV2(t *testing.T) (*v2, string) {
	t.Helper()
	mount := t.TempDir()
	for _, d := range []string{mount, filepath.Join(mount, "runner")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"cgroup.subtree_control", "cgroup.controllers"} {
			if err := os.WriteFile(filepath.Join(d, f), []byte("memory pids cpu\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	return &v2{mount: mount, root: "/runner", swap: true}, mount
}

// fakeV2Sandbox is fakeV2 with the sandbox "sb" made, returned with its
// directory.
func fakeV2Sandbox(t *testing.T) (*v2, string, string) {
	t.Helper()
	b, mount := fakeV2(t)
	sb := filepath.Join(mount, "runner", "sb")
	// containerd opens subtree_control without O_CREATE, as the kernel
	// provides it: create the sandbox's ahead, as mkdir would.
	if err := os.MkdirAll(sb, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sb, "cgroup.subtree_control"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return b, mount, sb
}

func TestV2LimitFiles(t *testing.T) {
	b, mount, sb := fakeV2Sandbox(t)
	for _, tc := range []struct {
		name string
		l    Limits
		want map[string]string
	}{
		{"limited", Limits{MemoryBytes: 64 << 20, Pids: 20, CPUWeight: 300, CPUQuota: 50 * time.Millisecond}, map[string]string{
			"memory.max": "67108864", "memory.swap.max": "0", "pids.max": "20", "cpu.weight": "300", "cpu.max": "50000 100000",
		}},
		{"unlimited", Limits{}, map[string]string{
			"memory.max": "9223372036854775807", "memory.swap.max": "9223372036854775807", "pids.max": "max", "cpu.weight": "100", "cpu.max": "max 100000",
		}},
		{"two cores per second", Limits{CPUQuota: 2 * time.Second, CPUPeriod: time.Second}, map[string]string{"cpu.max": "2000000 1000000"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := b.ensure("sb", tc.l); err != nil {
				t.Fatal(err)
			}
			for f, v := range tc.want {
				got, err := os.ReadFile(filepath.Join(sb, f))
				if err != nil {
					t.Fatal(err)
				}
				if strings.TrimSpace(string(got)) != v {
					t.Errorf("%s = %q, want %q", f, got, v)
				}
			}
		})
	}
	got, err := os.ReadFile(filepath.Join(mount, "runner", "cgroup.subtree_control"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"+memory", "+pids", "+cpu"} {
		if !strings.Contains(string(got), c) {
			t.Errorf("runner's cgroup.subtree_control = %q, want %s enabled for the sandboxes", got, c)
		}
	}
}

func TestV2UsageFiles(t *testing.T) {
	b, mount := fakeV2(t)
	sb := filepath.Join(mount, "runner", "sb")
	if err := os.MkdirAll(sb, 0o755); err != nil {
		t.Fatal(err)
	}
	for f, v := range map[string]string{
		"memory.current": "1048576\n",
		"memory.peak":    "4194304\n",
		"memory.stat":    "anon 1048576\n",
		"memory.events":  "low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\noom_group_kill 0\n",
		"cpu.stat":       "usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n",
		"pids.current":   "3\n",
		"pids.max":       "20\n",
	} {
		if err := os.WriteFile(filepath.Join(sb, f), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	u, err := b.usage("sb")
	if err != nil {
		t.Fatal(err)
	}
	want := Usage{MemoryBytes: 1 << 20, MemoryPeakBytes: 4 << 20, CPUTime: 1500 * time.Millisecond, Pids: 3, OOMKills: 2}
	if u != want {
		t.Fatalf("usage = %+v, want %+v", u, want)
	}
	m := &Manager{mode: ModeV2, b: b}
	if got, err := m.Usage("sb"); err != nil || got != want {
		t.Fatalf("Manager.Usage = %+v, %v; want %+v", got, err, want)
	}
	if _, err := m.Usage("missing"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Usage of a missing sandbox = %v, want ErrNotFound", err)
	}
	names, err := b.list()
	if err != nil || len(names) != 1 || names[0] != "sb" {
		t.Fatalf("list = %v, %v; want [sb]", names, err)
	}
	if ok, err := b.exists("missing"); ok || err != nil {
		t.Fatalf("exists(missing) = %v, %v", ok, err)
	}
	if n, err := OOMKills([]string{sb}); err != nil || n != 2 {
		t.Fatalf("OOMKills = %d, %v; want 2", n, err)
	}
}
