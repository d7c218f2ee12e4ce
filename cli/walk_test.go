package cli

import (
	"strings"
	"testing"
)

// The tests of what a new user met walking the docs (issue #35): a
// session id that is reused after its session ended.

// TestExecIDEnded: `runner exec box --id build -- CMD` a second time does
// not run CMD again (an id runs at most once, so a retry is safe); runner
// says so and how to run it afresh, instead of replaying the first run's
// output as if it were a new one. A spawn of another command under that
// id is refused with a hint that fits an ended session (rm-session frees
// the id; attach would only replay it).
func TestExecIDEnded(t *testing.T) {
	d := sharedDaemon(t)
	box := d.sandbox(t, "walk-ended")
	argv := []string{"exec", box, "--id", "build", "--", "sh", "-c", "echo compiling; exit 3"}

	out, errOut, code := d.cli(t, nil, argv...)
	if code != 3 || out != "compiling\n" || errOut != "" {
		t.Fatalf("first exec: exit %d stdout %q stderr %q; want 3, \"compiling\\n\", no stderr", code, out, errOut)
	}
	out, errOut, code = d.cli(t, nil, argv...)
	wantNote := "runner: note: session build already ended (exit code 3): replaying its output, not running the command again (runner rm-session walk-ended build, or another --id, runs it afresh)\n"
	if code != 3 || out != "compiling\n" || errOut != wantNote {
		t.Errorf("second exec: exit %d stdout %q stderr %q; want 3, \"compiling\\n\", %q", code, out, errOut, wantNote)
	}
	if n := strings.Count(d.ok(t, "logs", box, "build"), "compiling"); n != 1 {
		t.Errorf("the journal holds %d runs, want 1 (the id must not run twice)", n)
	}

	_, errOut, code = d.cli(t, nil, "spawn", box, "--id", "build", "--", "true")
	wantHint := "runner: hint: session build ended (exit code 3), with another command (it ran sh -c 'echo compiling; exit 3', this asks true): runner logs walk-ended build shows its output; runner rm-session walk-ended build frees the id, or pick another --id\n"
	if code != exitInvalid || !strings.HasSuffix(errOut, wantHint) {
		t.Errorf("spawn of another command under an ended id: exit %d stderr %q; want %d, ending %q", code, errOut, exitInvalid, wantHint)
	}

	// The hint's way out works: the id runs afresh once deleted.
	d.ok(t, "rm-session", box, "build")
	out, errOut, code = d.cli(t, nil, argv...)
	if code != 3 || out != "compiling\n" || errOut != "" {
		t.Errorf("exec after rm-session: exit %d stdout %q stderr %q; want 3, \"compiling\\n\", no stderr", code, out, errOut)
	}

	// --json: the note is a warning object, stdout stays one document.
	out, errOut, code = d.cli(t, nil, append([]string{"--json"}, argv...)...)
	if code != 3 || !strings.HasPrefix(out, "{") || !strings.HasPrefix(errOut, `{"warning":"session build already ended (exit code 3)`) {
		t.Errorf("exec --json of an ended id: exit %d stdout %q stderr %q; want 3, a JSON document, a warning object", code, out, errOut)
	}
}

// TestExecIDRunning: exec --id of a session that already runs the same
// command follows it and says it did not start it.
func TestExecIDRunning(t *testing.T) {
	d := sharedDaemon(t)
	box := d.sandbox(t, "walk-running")
	d.ok(t, "spawn", box, "--id", "srv", "--", "sh", "-c", "echo up; sleep 3")
	out, errOut, code := d.cli(t, nil, "exec", box, "--id", "srv", "--", "sh", "-c", "echo up; sleep 3")
	want := "runner: note: session srv already runs this command: following it (not started again)\n"
	if code != 0 || out != "up\n" || errOut != want {
		t.Errorf("exec --id of a running session: exit %d stdout %q stderr %q; want 0, \"up\\n\", %q", code, out, errOut, want)
	}
}
