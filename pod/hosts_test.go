package pod

import (
	"os"
	"testing"
	"time"
)

// TestPodHosts: a pod's /etc/hosts is its own (its host name resolves,
// not the host's file); root inside may edit it, the edit is kept when
// the pod is made again on its upper directory, and the host's file is
// unchanged.
func TestPodHosts(t *testing.T) {
	before, err := os.ReadFile("/etc/hosts")
	if err != nil {
		t.Fatal(err)
	}
	cfg := newConfig(t, "hosts", 30)
	p := create(t, cfg)
	want := "127.0.0.1\tlocalhost\n127.0.1.1\thosts\n::1\tlocalhost ip6-localhost ip6-loopback\n"
	if out, err := inPod(t, p, "cat /etc/hosts; getent hosts hosts | cut -d' ' -f1"); out != want+"127.0.1.1\n" {
		t.Errorf("got %q (%v), want %q and the name resolving to 127.0.1.1", out, err, want)
	}
	if out, err := inPod(t, p, "echo '192.0.2.7 db' >> /etc/hosts"); err != nil {
		t.Fatalf("edit /etc/hosts: %v %s", err, out)
	}
	if err := p.Destroy(ctxT(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	p = create(t, cfg)
	if out, err := inPod(t, p, "cat /etc/hosts"); out != want+"192.0.2.7 db\n" {
		t.Errorf("made again: got %q (%v), want the edit kept", out, err)
	}
	if after, _ := os.ReadFile("/etc/hosts"); string(after) != string(before) {
		t.Errorf("the host's /etc/hosts changed: %q", after)
	}
}
