package daemon_test

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/daemon"
	"github.com/agentrunner/runner/internal/browsertest"
	"github.com/agentrunner/runner/internal/testcap"
	"github.com/agentrunner/runner/netpolicy/netlab"
	"github.com/agentrunner/runner/wire"
)

// previewNetDaemon starts runnerd in this process with its default
// isolation (every sandbox in a network namespace of its own, in a lab of
// its own) and a preview listener on loopback. It returns the API and the
// preview listener's address.
func previewNetDaemon(t *testing.T) (*api, string) {
	t.Helper()
	testcap.Root(t, "an isolated sandbox's network namespace needs a root runnerd")
	lab := netlab.New(t)
	netState := netStateDir(t)
	previewAddr := freeLoopback(t)
	_, previewPort, _ := net.SplitHostPort(previewAddr)
	// Root's default isolation (a pod where pods can be made) and its
	// default identity range: a pod needs a block of 65,536 ids.
	a := startDaemonCfg(t, daemon.Config{
		StateDir: passableTempDir(t), Token: testToken,
		NetPolicyState: netState, NetPolicyPool: netlab.Pool, NetPolicyHostNetNS: lab.HostNetNS,
		DNSUpstream:   []netip.AddrPort{netip.AddrPortFrom(netlab.C, 53)},
		PreviewListen: previewAddr, PreviewURLTemplate: "http://{token}.localhost:" + previewPort + "/",
	})
	return a, previewAddr
}

// previewGet is a browser without a credential opening u: it dials the
// preview listener with u's host. It returns the status, the Runner-Error
// header and the body.
func previewGet(t *testing.T, previewAddr, u string) (int, string, []byte) {
	t.Helper()
	parsed, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", "http://"+previewAddr+"/", nil)
	req.Host = parsed.Host
	hc := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header.Get(wire.HeaderError), b
}

// askURL asks runnerd for the URL of port in sandbox and returns it with
// its listening flag.
func askURL(a *api, sandbox string, port int) (string, bool) {
	a.t.Helper()
	var u wire.URL
	a.must("POST", "/v1/sandboxes/"+sandbox+"/urls", wire.URLRequest{Port: port}, 200, &u)
	if u.Listening == nil {
		a.t.Fatalf("URL answer %+v lacks listening", u)
	}
	return u.URL, *u.Listening
}

// TestPreviewLoopbackServer: url-or-nothing for the servers people run. A
// default (isolated) sandbox of a root runnerd has its own network
// namespace; python3 -m http.server bound to 127.0.0.1, to ::1, to
// 0.0.0.0 and to the sandbox's own address each serve their page, byte
// for byte, to the URL runnerd reported, opened in a real headless
// Chromium with an empty profile. Before the server starts, the URL is
// handed over with listening false and answers a 502 page at once.
func TestPreviewLoopbackServer(t *testing.T) {
	bin := browsertest.Find()
	if bin == "" {
		testcap.Skip(t, "chromium", "the real-browser preview test needs Chromium: apt-get install -y --no-install-recommends chromium")
	}
	a, previewAddr := previewNetDaemon(t)
	sb := a.createSandbox("web")
	if !sb.Isolated || sb.Network == nil {
		t.Fatalf("sandbox with no options: isolated %v network %v, want isolated with a network namespace", sb.Isolated, sb.Network)
	}
	// The sandbox's own address: the source of its default route (a UDP
	// connect sends nothing).
	own := a.run("web", "python3", "-c", "import socket\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\ns.connect(('192.0.2.1',9))\nprint(s.getsockname()[0])")

	for i, bind := range []string{"127.0.0.1", "::1", "0.0.0.0", own} {
		name := bind
		if bind == own {
			name = "sandbox address"
		}
		t.Run(name, func(t *testing.T) {
			port := 8000 + i
			nonce := fmt.Sprintf("served-on-%s-%d", strings.ReplaceAll(bind, ":", "_"), port)
			page := `<!DOCTYPE html><html><head><title>sandbox app</title></head><body><p id="n">` + nonce + `</p></body></html>`
			dir := filepath.Join(sb.Workspace, fmt.Sprintf("site%d", i))
			a.run("web", "sh", "-c", `mkdir -p "$1" && printf %s "$2" > "$1/index.html"`, "sh", dir, page)

			u, listening := askURL(a, "web", port)
			if listening {
				t.Fatalf("URL of port %d before the server: listening true, want false", port)
			}
			start := time.Now()
			status, code, body := previewGet(t, previewAddr, u)
			if status != http.StatusBadGateway || code != string(wire.CodeUnavailable) || !bytes.Contains(body, []byte("Sandbox port not serving")) {
				t.Errorf("URL before the server: %d %s %q, body %q; want 502, unavailable, the not-serving page", status, wire.HeaderError, code, body)
			}
			if took := time.Since(start); took > 3*time.Second {
				t.Errorf("URL before the server answered after %v, want at once", took)
			}

			a.spawn("web", wire.CreateSession{ID: fmt.Sprintf("http%d", i),
				Argv: []string{"python3", "-m", "http.server", fmt.Sprint(port), "--bind", bind, "--directory", dir}})
			deadline := time.Now().Add(20 * time.Second)
			for {
				again, listening := askURL(a, "web", port)
				if again != u {
					t.Fatalf("second URL %q, want the first, %q", again, u)
				}
				if listening {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("python3 -m http.server --bind %s: runnerd never saw it listen on %d", bind, port)
				}
				time.Sleep(100 * time.Millisecond)
			}
			if status, _, body := previewGet(t, previewAddr, u); status != 200 || string(body) != page {
				t.Errorf("GET %s: %d %q, want 200 %q", u, status, body, page)
			}
			dom, stderr, err := browsertest.DumpDOM(t, bin, u)
			if err != nil {
				t.Fatalf("chromium --dump-dom: %v\nstderr:\n%s", err, stderr)
			}
			// Chromium serializes the DOM it built: the page's own markup,
			// the doctype on its own line.
			want := "<!DOCTYPE html>\n" + strings.TrimPrefix(page, "<!DOCTYPE html>") + "\n"
			if dom != want {
				t.Errorf("chromium rendered\n%q\nwant\n%q\nchromium stderr:\n%s", dom, want, stderr)
			}
		})
	}
}

// TestPreviewNeverHostLoopback: the proxy connects from inside the
// sandbox's namespace, so "127.0.0.1" is the sandbox's loopback, never the
// host's. With a server on the host's 127.0.0.1:PORT and nothing on PORT
// in the sandbox, the sandbox's URL answers the not-serving page, never
// the host's server.
func TestPreviewNeverHostLoopback(t *testing.T) {
	a, previewAddr := previewNetDaemon(t)
	a.createSandbox("web")
	host, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "the host's own service") })}
	served := make(chan struct{})
	go func() { defer close(served); srv.Serve(host) }()
	t.Cleanup(func() { srv.Close(); <-served })
	port := host.Addr().(*net.TCPAddr).Port

	u, listening := askURL(a, "web", port)
	if listening {
		t.Errorf("URL of port %d, free in the sandbox, busy on the host: listening true, want false", port)
	}
	if status, code, body := previewGet(t, previewAddr, u); status != http.StatusBadGateway || code != string(wire.CodeUnavailable) {
		t.Errorf("sandbox URL of a port only the host serves: %d %s %q, body %q; want 502, unavailable", status, wire.HeaderError, code, body)
	}
}

// keepAliveServer is a python3 HTTP/1.1 server that keeps connections
// open and answers every GET with body, on 127.0.0.1:port.
func keepAliveServer(port int, body string) []string {
	script := `import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        b = sys.argv[2].encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
`
	return []string{"python3", "-c", script, fmt.Sprint(port), body}
}

// TestPreviewSandboxesSamePort: two sandboxes serve the same port on
// their own 127.0.0.1 with keep-alive servers. Each URL reaches its own
// sandbox, request after request: the proxy's idle connection into one
// sandbox is never reused for the other's request (its pool is keyed per
// namespace, not by the address, which is the same in both).
func TestPreviewSandboxesSamePort(t *testing.T) {
	a, previewAddr := previewNetDaemon(t)
	const port = 8080
	urls := map[string]string{}
	for _, name := range []string{"left", "right"} {
		a.createSandbox(name)
		a.spawn(name, wire.CreateSession{ID: "srv", Argv: keepAliveServer(port, "served by "+name)})
		deadline := time.Now().Add(20 * time.Second)
		for {
			u, listening := askURL(a, name, port)
			if listening {
				urls[name] = u
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("sandbox %s: the server never listened on %d", name, port)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	for i := 0; i < 3; i++ {
		for _, name := range []string{"left", "right"} {
			if status, _, body := previewGet(t, previewAddr, urls[name]); status != 200 || string(body) != "served by "+name {
				t.Errorf("round %d, %s's URL: %d %q, want 200 %q", i, name, status, body, "served by "+name)
			}
		}
	}
}
