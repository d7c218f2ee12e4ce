package preview

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/agentrunner/runner/internal/browsertest"
	"github.com/agentrunner/runner/internal/testcap"
)

// TestBrowserOpensReportedURL is the preview listener's url-or-nothing
// acceptance test (a reported preview URL works in a plain browser): serve
// on a port "inside the sandbox", then open the URL the Server reports in a
// real browser with a fresh, empty profile (no account, no cookie, no
// credential). The page runs a script that fetches /api from its own origin
// through the proxy and writes the answer into the DOM, so the rendered DOM
// proves the page and a same-origin request both reached the sandbox port.
func TestBrowserOpensReportedURL(t *testing.T) {
	bin := browsertest.Find()
	if bin == "" {
		testcap.Skip(t, "chromium", fmt.Sprintf("the real-browser preview test found no Chromium binary (%s) on PATH; "+
			"install it with: apt-get install -y --no-install-recommends chromium",
			strings.Join(browsertest.Names, ", ")))
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

	dom, stderr, err := browsertest.DumpDOM(t, bin, url)
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
