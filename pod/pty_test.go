package pod

import "testing"

// TestPodPTY: a pseudo-terminal can be made inside a pod (the pod's own
// devpts: script, tmux, expect, apt's dpkg log need one), and it is the
// pod's: its /dev/pts lists only the pod's ptys.
func TestPodPTY(t *testing.T) {
	p := create(t, newConfig(t, "pty", 29))
	out, err := inPod(t, p, `script -qc 'tty; ls -1 /dev/pts' /dev/null </dev/null | tr -d '\r'`)
	if want := "/dev/pts/0\n0\nptmx\n"; err != nil || out != want {
		t.Errorf("got %q (%v), want %q", out, err, want)
	}
}
