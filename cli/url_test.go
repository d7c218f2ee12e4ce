package cli

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/wire"
)

// freePort returns a loopback port nothing listens on (bound, released).
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestURLBeforeListening: `runner url` on a port nothing listens on yet
// prints the URL with a note that it works once something listens (and
// --json says listening false); --wait waits, bounded, for the server:
// it fails with unavailable and prints no URL when nothing comes in time,
// and prints the same URL once a server that starts late listens, which
// then serves its page through it.
func TestURLBeforeListening(t *testing.T) {
	previewPort := freePort(t)
	previewAddr := fmt.Sprintf("127.0.0.1:%d", previewPort)
	d, err := startDaemonArgs(filepath.Join(binDir, "runnerd"), t.TempDir(), "--netpolicy", "off", "--cgroups", "off",
		"--preview-listen", previewAddr, "--preview-url", fmt.Sprintf("http://{token}.localhost:%d/", previewPort))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.stop)
	d.ok(t, "create", "web")
	port := freePort(t)
	p := fmt.Sprint(port)

	out, errOut, code := d.cli(t, nil, "url", "web", p)
	u := strings.TrimSuffix(out, "\n")
	if code != 0 || !strings.HasPrefix(u, "http://") || strings.Contains(u, "\n") {
		t.Fatalf("url before a listener: exit %d stdout %q stderr %q; want 0 and the URL", code, out, errOut)
	}
	wantNote := fmt.Sprintf("runner: note: nothing listens on port %d in sandbox web yet; the URL starts working once something does (wait for it with --wait DURATION)\n", port)
	if errOut != wantNote {
		t.Errorf("url before a listener: stderr %q, want %q", errOut, wantNote)
	}
	if got := decode[wire.URL](t, d.ok(t, "--json", "url", "web", p)); got.URL != u || got.Listening == nil || *got.Listening {
		t.Errorf("--json url before a listener: %+v, want %s with listening false", got, u)
	}

	// --wait with nothing coming: bounded, unavailable, no URL.
	start := time.Now()
	out, errOut, code = d.cli(t, nil, "url", "web", p, "--wait", "600ms")
	took := time.Since(start)
	wantErr := fmt.Sprintf("runner: url web %d: unavailable: nothing listens on port %d in sandbox web after --wait 600ms\n"+
		"runner: hint: the URL starts working once something listens on port %d; run without --wait to print it now\n", port, port, port)
	if code != 255 || out != "" || errOut != wantErr { // unavailable (docs/cli.md)
		t.Errorf("url --wait 600ms, nothing listening: exit %d stdout %q stderr %q; want 255, no URL, %q", code, out, errOut, wantErr)
	}
	if took < 600*time.Millisecond || took > 10*time.Second {
		t.Errorf("url --wait 600ms took %v", took)
	}
	if _, errOut, code := d.cli(t, nil, "url", "web", p, "--wait", "-1s"); code != 2 { // usage
		t.Errorf("url --wait -1s: exit %d stderr %q, want 2", code, errOut)
	}

	// A server that starts late, bound to loopback only.
	d.ok(t, "spawn", "web", "--id", "late", "--", "sh", "-c",
		fmt.Sprintf("sleep 1.5; exec python3 -m http.server %d --bind 127.0.0.1 --directory /nonexistent-dir-for-404", port))
	start = time.Now()
	out, errOut, code = d.cli(t, nil, "url", "--wait", "30s", "web", p)
	took = time.Since(start)
	if code != 0 || out != u+"\n" || errOut != "" {
		t.Fatalf("url --wait 30s, server starting late: exit %d stdout %q stderr %q; want 0, %q, nothing on stderr", code, out, errOut, u+"\n")
	}
	if took < time.Second {
		t.Errorf("url --wait returned after %v, before the server (started 1.5 s after the spawn) could listen", took)
	}
	if got := decode[wire.URL](t, d.ok(t, "--json", "url", "web", p)); got.URL != u || got.Listening == nil || !*got.Listening {
		t.Errorf("--json url with a listener: %+v, want %s with listening true", got, u)
	}
	// The URL reaches the server: python's own 404 for a missing directory.
	parsed, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", "http://"+previewAddr+"/", nil)
	req.Host = parsed.Host
	resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 404 || resp.Header.Get(wire.HeaderError) != "" || !strings.Contains(resp.Header.Get("Server"), "SimpleHTTP") {
		t.Errorf("GET the URL: %d %s %q Server %q, body %q; want python's own 404", resp.StatusCode, wire.HeaderError, resp.Header.Get(wire.HeaderError), resp.Header.Get("Server"), body)
	}
}
