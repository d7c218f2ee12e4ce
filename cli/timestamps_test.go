package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/wire"
)

// TestLogsTimestamps (issue 25 item 4): logs --timestamps prefixes every
// line with the time of the journal mark at or before its first byte, the
// same bytes runnerd's marks endpoint holds, on both streams, one stream,
// a --tail and a cursor that enters a line in its middle.
func TestLogsTimestamps(t *testing.T) {
	d := sharedDaemon(t)
	box := d.sandbox(t, "ts-box")
	id := strings.TrimSpace(d.ok(t, "spawn", box, "--", "sh", "-c", "printf 'a\\nb\\n'; sleep 1.2; printf 'c\\n'; printf 'e\\n' >&2"))
	d.ok(t, "logs", box, id, "-f")

	tok, err := os.ReadFile(filepath.Join(d.state, "token"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New("http://"+d.addr, strings.TrimSpace(string(tok)), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	stamps := func(stream string) []wire.Mark {
		t.Helper()
		m, err := c.Marks(context.Background(), box, id, stream, 0)
		if err != nil {
			t.Fatal(err)
		}
		return m.Marks
	}
	out, errs := stamps("stdout"), stamps("stderr")
	if len(out) != 2 || out[0].Offset != 0 || out[1].Offset != 4 || len(errs) != 1 || errs[0].Offset != 0 {
		t.Fatalf("marks: stdout %+v stderr %+v, want stdout at 0 and 4, stderr at 0", out, errs)
	}
	if gap := out[1].Time.Sub(out[0].Time); gap < time.Second {
		t.Fatalf("stdout marks %v apart, want the 1.2 s sleep", gap)
	}
	ta, tc, te := out[0].Time.UTC().Format(stampLayout), out[1].Time.UTC().Format(stampLayout), errs[0].Time.UTC().Format(stampLayout)
	for _, tt := range []struct {
		args             []string
		wantOut, wantErr string
	}{
		{[]string{"--timestamps"}, ta + " a\n" + ta + " b\n" + tc + " c\n", te + " e\n"},
		{[]string{"-t", "-f"}, ta + " a\n" + ta + " b\n" + tc + " c\n", te + " e\n"},
		{[]string{"--timestamps", "--stream", "stdout"}, ta + " a\n" + ta + " b\n" + tc + " c\n", ""},
		{[]string{"--timestamps", "--stream", "stderr"}, te + " e\n", ""},
		{[]string{"--timestamps", "--tail", "2"}, ta + " b\n" + tc + " c\n", te + " e\n"},
		{[]string{"--timestamps", "--stream", "stdout", "--cursor", "1"}, ta + " \n" + ta + " b\n" + tc + " c\n", ""},
		{[]string{"--timestamps", "--cursor", "5", "--stderr-cursor", "2"}, tc + " \n", ""},
	} {
		o, e, code := d.cli(t, nil, append([]string{"logs", box, id}, tt.args...)...)
		if o != tt.wantOut || e != tt.wantErr || code != 0 {
			t.Errorf("logs %v: stdout %q stderr %q exit %d; want %q, %q, 0", tt.args, o, e, code, tt.wantOut, tt.wantErr)
		}
	}
	// Without the flag nothing is stamped.
	if o := d.ok(t, "logs", box, id, "--stream", "stdout"); o != "a\nb\nc\n" {
		t.Errorf("logs without --timestamps: got %q", o)
	}
}
