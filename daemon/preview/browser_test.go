package preview

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/internal/testcap"
)

// chromiumNames are the binaries the browser test looks for, in order. Debian
// ships "chromium" (apt-get install chromium).
var chromiumNames = []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"}

// TestBrowserOpensReportedURL is the preview listener's url-or-nothing
// acceptance test (a reported preview URL works in a plain browser): serve
// on a port "inside the sandbox", then open the URL the Server reports in a
// real browser with a fresh, empty profile (no account, no cookie, no
// credential). The page runs a script that fetches /api from its own origin
// through the proxy and writes the answer into the DOM, so the rendered DOM
// proves the page and a same-origin request both reached the sandbox port.
func TestBrowserOpensReportedURL(t *testing.T) {
	bin := findChromium()
	if bin == "" {
		testcap.Skip(t, "chromium", fmt.Sprintf("the real-browser preview test found no Chromium binary (%s) on PATH; "+
			"install it with: apt-get install -y --no-install-recommends chromium",
			strings.Join(chromiumNames, ", ")))
	}

	tok0, _ := NewToken()
	pageNonce, apiNonce := "page-"+tok0[:12], "api-"+tok0[12:24]
	type hit struct{ path, host, cookie, authorization string }
	var (
		mu   sync.Mutex // guards hits
		hits []hit
	)
	addr := startTarget(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hits = append(hits, hit{r.URL.Path, r.Host, r.Header.Get("Cookie"), r.Header.Get("Authorization")})
		mu.Unlock()
		switch r.URL.Path {
		case "/":
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			fmt.Fprintf(w, `<!doctype html><html><head><title>sandbox app</title></head><body>
<h1 id="greeting">Hello from the sandbox port: %s</h1>
<p id="api">api: pending</p>
<script src="/app.js"></script>
</body></html>`, pageNonce)
		case "/app.js":
			// A synchronous request, so it completes before the load event and
			// --dump-dom sees its result.
			w.Header().Set("Content-Type", "text/javascript")
			io.WriteString(w, `(function () {
  var x = new XMLHttpRequest();
  x.open("GET", "/api", false);
  x.send();
  document.getElementById("api").textContent = "api: " + x.status + " " + x.responseText;
})();`)
		case "/api":
			w.Header().Set("Content-Type", "text/plain")
			io.WriteString(w, apiNonce)
		default:
			http.NotFound(w, r)
		}
	}))

	reg := newRegistry()
	tok := reg.add(t, "webapp", addr)
	p := startPreview(t, reg)
	url := p.URL(tok)
	wantHost := fmt.Sprintf("%s.localhost:%d", tok, p.port)
	if url != "http://"+wantHost+"/" {
		t.Fatalf("reported URL = %q, want http://%s/", url, wantHost)
	}

	dom, stderr, err := dumpDOM(t, bin, url)
	if err != nil {
		t.Fatalf("chromium --dump-dom: %v\nstderr:\n%s", err, stderr)
	}
	for _, want := range []string{
		"Hello from the sandbox port: " + pageNonce,
		"api: 200 " + apiNonce,
	} {
		if !strings.Contains(dom, want) {
			t.Errorf("rendered DOM lacks %q\nDOM:\n%s\nchromium stderr:\n%s", want, dom, stderr)
		}
	}

	mu.Lock()
	defer mu.Unlock()
	paths := map[string]bool{}
	for _, h := range hits {
		paths[h.path] = true
		if h.host != wantHost {
			t.Errorf("target saw Host %q for %s, want %q", h.host, h.path, wantHost)
		}
		if h.cookie != "" || h.authorization != "" {
			t.Errorf("browser sent a credential for %s: Cookie %q, Authorization %q", h.path, h.cookie, h.authorization)
		}
	}
	for _, want := range []string{"/", "/app.js", "/api"} {
		if !paths[want] {
			t.Errorf("target never saw %s through the preview; saw %v", want, paths)
		}
	}
}

func findChromium() string {
	for _, name := range chromiumNames {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// dumpDOM opens url in headless Chromium with a fresh profile and returns the
// DOM after load. Chromium runs in its own process group, killed as a group
// on timeout and once more after it exits, for any helper it left behind.
func dumpDOM(t *testing.T, bin, url string) (dom, stderr string, err error) {
	t.Helper()
	home := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin,
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
		"--no-first-run", "--disable-background-networking", "--disable-component-update",
		"--disable-sync", "--disable-dev-shm-usage",
		"--user-data-dir="+t.TempDir(),
		"--dump-dom", url)
	cmd.Env = append(os.Environ(), "HOME="+home, "XDG_CONFIG_HOME="+home, "XDG_CACHE_HOME="+home)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Start(); err != nil {
		return "", "", err
	}
	pgid := cmd.Process.Pid
	err = cmd.Wait()
	if kerr := syscall.Kill(-pgid, syscall.SIGKILL); kerr != nil && !errors.Is(kerr, syscall.ESRCH) {
		t.Logf("kill chromium process group %d: %v", pgid, kerr)
	}
	if ctx.Err() != nil {
		err = fmt.Errorf("timed out after 45s: %w", err)
	}
	return out.String(), errOut.String(), err
}
