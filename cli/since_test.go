package cli

import (
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestLogsSince: --since starts at output written at or after a time (up
// to 1 s earlier, never later), as a duration or an RFC 3339 time, and
// excludes --cursor and --tail.
func TestLogsSince(t *testing.T) {
	d := sharedDaemon(t)
	box := d.sandbox(t, "since-box")
	id := strings.TrimSpace(d.ok(t, "spawn", box, "--", "sh", "-c", "printf a; sleep 2.5; printf b"))
	deadline := time.Now().Add(10 * time.Second)
	d.logsUntil(t, deadline, box, id, "a", "no output")
	// More than the 1 s granularity after "a", well before "b".
	mid := time.Now().Add(1200 * time.Millisecond)
	if got := d.ok(t, "logs", box, id, "-f"); got != "ab" {
		t.Fatalf("logs -f: got %q, want ab", got)
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--since", mid.UTC().Format(time.RFC3339Nano)}, "b"},
		{[]string{"--since", mid.Format(time.RFC3339Nano), "-f"}, "b"},
		{[]string{"--since", "1h"}, "ab"},
		{[]string{"--since", time.Now().Add(time.Hour).Format(time.RFC3339)}, ""},
	} {
		if got := d.ok(t, append([]string{"logs", box, id}, tt.args...)...); got != tt.want {
			t.Errorf("logs %v: got %q, want %q", tt.args, got, tt.want)
		}
	}
	out, errOut, code := d.cli(t, nil, "attach", box, id, "--since", mid.Format(time.RFC3339Nano))
	if out != "b" || errOut != "" || code != 0 {
		t.Errorf("attach --since: stdout %q stderr %q exit %d; want b, \"\", 0", out, errOut, code)
	}
	if out, _, code := d.cli(t, nil, "attach", box, id, "--since", "1h"); out != "ab" || code != 0 {
		t.Errorf("attach --since 1h: stdout %q exit %d; want ab, 0", out, code)
	}
	for _, args := range [][]string{
		{"logs", box, id, "--since", "1h", "--cursor", "0"},
		{"logs", box, id, "--since", "1h", "--tail", "1"},
		{"logs", box, id, "--since", "yesterday"},
		{"logs", box, id, "--since", "-5m"},
		{"attach", box, id, "--since", "1h", "--cursor", "1"},
		{"attach", box, id, "--since", "1h", "--tail", "0"},
		{"attach", box, id, "--since", "nope"},
	} {
		out, errOut, code := d.cli(t, nil, args...)
		if code != 2 || out != "" || !strings.Contains(errOut, "--since") || !strings.Contains(errOut, "--help)") {
			t.Errorf("%v: stdout %q stderr %q exit %d; want exit 2 with usage on stderr", args, out, errOut, code)
		}
	}
}

// TestAttachSinceReconnect: an attach --since that loses runnerd (stopped
// and started again) continues by cursor: the bytes it printed are not
// printed again (a reattach by time would print "b" twice).
func TestAttachSinceReconnect(t *testing.T) {
	d, state := ownDaemon(t)
	t.Cleanup(func() { d.stop() })
	box := d.sandbox(t, "since-re")
	id := strings.TrimSpace(d.ok(t, "spawn", box, "--", "sh", "-c", "printf a; sleep 2.5; printf b; while [ ! -e go ]; do sleep 0.05; done; printf c"))
	deadline := time.Now().Add(10 * time.Second)
	d.logsUntil(t, deadline, box, id, "a", "no output")
	mid := time.Now().Add(1200 * time.Millisecond)
	d.logsUntil(t, deadline, box, id, "ab", "no b")

	cmd := d.command("attach", box, id, "--since", mid.Format(time.RFC3339Nano))
	out, errOut := &syncBuffer{}, &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(waited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // only if the test failed before it ended
		<-waited
	})
	for out.String() != "b" {
		if time.Now().After(deadline) {
			t.Fatalf("attach --since printed %q, want b; stderr %q", out.String(), errOut.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Stop runnerd (sessions outlive it) and start it on the same state.
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	<-d.done
	var err error
	if d, err = startDaemon(state); err != nil {
		t.Fatal(err)
	}
	for !strings.Contains(errOut.String(), "reconnected") {
		if time.Now().After(deadline.Add(20 * time.Second)) {
			t.Fatalf("attach did not reconnect; stderr %q", errOut.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	d.ok(t, "exec", box, "--", "touch", "go")
	select {
	case <-waited:
	case <-time.After(30 * time.Second):
		t.Fatalf("attach did not end; stdout %q stderr %q", out.String(), errOut.String())
	}
	if got := out.String(); got != "bc" || cmd.ProcessState.ExitCode() != 0 {
		t.Errorf("attach --since across a restart: stdout %q exit %d, want bc, 0; stderr %q", got, cmd.ProcessState.ExitCode(), errOut.String())
	}
}
