package preview

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// seen records the last request a target received.
type seen struct {
	mu   sync.Mutex // guards req and body
	req  *http.Request
	body []byte
}

func (s *seen) record(r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.req, s.body = r, b
}

func (s *seen) last() (*http.Request, []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.req, s.body
}

// mustLast is last, failing the test when the target saw no request.
func (s *seen) mustLast(t *testing.T) (*http.Request, []byte) {
	t.Helper()
	in, body := s.last()
	if in == nil {
		t.Fatal("target saw no request")
	}
	return in, body
}

func allBytes() []byte {
	b := make([]byte, 0, 3*256)
	for i := 0; i < 3*256; i++ {
		b = append(b, byte(i))
	}
	return b
}

func TestProxyPassesExactBytesAndStatus(t *testing.T) {
	want := allBytes()
	var got seen
	addr := startTarget(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.record(r)
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("X-App", "yes")
		w.WriteHeader(http.StatusTeapot)
		w.Write(want)
	}))
	reg := newRegistry()
	tok := reg.add(t, "alpha", addr)
	p := startPreview(t, reg)
	c := p.client(t)

	url := p.URL(tok)
	if wantURL := fmt.Sprintf("http://%s.localhost:%d/", tok, p.port); url != wantURL {
		t.Fatalf("URL = %q, want %q", url, wantURL)
	}
	req, _ := http.NewRequest(http.MethodPost, url+"some/path?q=1&r=%2F", bytes.NewReader([]byte("request body")))
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusTeapot {
		t.Errorf("status = %d, want %d", res.StatusCode, http.StatusTeapot)
	}
	if !bytes.Equal(body, want) {
		t.Errorf("body = %d bytes, differs from the target's %d bytes", len(body), len(want))
	}
	if res.Header.Get("X-App") != "yes" {
		t.Errorf("X-App = %q, want the target's header", res.Header.Get("X-App"))
	}

	in, inBody := got.mustLast(t)
	checks := []struct{ name, got, want string }{
		{"method", in.Method, http.MethodPost},
		{"path", in.URL.Path, "/some/path"},
		{"query", in.URL.RawQuery, "q=1&r=%2F"},
		{"body", string(inBody), "request body"},
		{"Host", in.Host, fmt.Sprintf("%s.localhost:%d", tok, p.port)},
		{"X-Forwarded-Host", in.Header.Get("X-Forwarded-Host"), fmt.Sprintf("%s.localhost:%d", tok, p.port)},
		{"X-Forwarded-Proto", in.Header.Get("X-Forwarded-Proto"), "http"},
		{"X-Forwarded-For", in.Header.Get("X-Forwarded-For"), "127.0.0.1"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("target saw %s %q, want %q", c.name, c.got, c.want)
		}
	}
	if strings.Contains(p.logs.String(), tok) {
		t.Errorf("server log contains the full token:\n%s", p.logs.String())
	}
}

// The preview is the user's app: its own credentials pass through, and a
// forged X-Forwarded-For from the browser does not.
func TestProxyForwardsAppCredentials(t *testing.T) {
	got, p, tok := recorded(t)

	req, _ := http.NewRequest(http.MethodGet, p.URL(tok), nil)
	req.Header.Set("Authorization", "Basic YXBwOnNlY3JldA==")
	req.Header.Set("Cookie", "session=abc")
	req.Header.Set("X-Forwarded-For", "203.0.113.9")
	res, err := p.client(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	in, _ := got.mustLast(t)
	if g := in.Header.Get("Authorization"); g != "Basic YXBwOnNlY3JldA==" {
		t.Errorf("Authorization = %q, want the app's own header unchanged", g)
	}
	if g := in.Header.Get("Cookie"); g != "session=abc" {
		t.Errorf("Cookie = %q, want %q", g, "session=abc")
	}
	if g := in.Header.Get("X-Forwarded-For"); g != "127.0.0.1" {
		t.Errorf("X-Forwarded-For = %q, want only the real peer 127.0.0.1", g)
	}
}

func TestProxyConfinesCookiesAndReferrer(t *testing.T) {
	addr := startTarget(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Add("Set-Cookie", "a=1; Domain=localhost; Path=/; HttpOnly")
		w.Header().Add("Set-Cookie", "b=2; path=/x; domain=.localhost")
		if r.URL.Path == "/own-policy" {
			w.Header().Set("Referrer-Policy", "no-referrer")
		}
	}))
	reg := newRegistry()
	tok := reg.add(t, "alpha", addr)
	p := startPreview(t, reg)
	c := p.client(t)

	res, err := c.Get(p.URL(tok))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	got := res.Header.Values("Set-Cookie")
	want := []string{"a=1; Path=/; HttpOnly", "b=2; path=/x"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("Set-Cookie = %q, want %q", got, want)
	}
	if g := res.Header.Get("Referrer-Policy"); g != "same-origin" {
		t.Errorf("Referrer-Policy = %q, want same-origin by default", g)
	}

	res, err = c.Get(p.URL(tok) + "own-policy")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if g := res.Header.Values("Referrer-Policy"); len(g) != 1 || g[0] != "no-referrer" {
		t.Errorf("Referrer-Policy = %q, want the app's own [no-referrer]", g)
	}
}

func TestStripCookieDomain(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"no attributes", "a=1", "a=1"},
		{"no domain", "a=1; Path=/; Secure", "a=1; Path=/; Secure"},
		{"domain", "a=1; Domain=example.com; Path=/", "a=1; Path=/"},
		{"lowercase and spaces", "a=1;  domain = .example.com ;Secure", "a=1;Secure"},
		{"two domains", "a=1; Domain=a; Domain=b", "a=1"},
		{"value mentions domain", "domain=x; Path=/", "domain=x; Path=/"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := stripCookieDomain(tt.in); got != tt.want {
				t.Errorf("stripCookieDomain(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestUnknownTokenIs404(t *testing.T) {
	addr := startTarget(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("target reached for %s", r.Host)
	}))
	reg := newRegistry()
	known := reg.add(t, "alpha", addr)
	unknown, err := NewToken()
	if err != nil {
		t.Fatal(err)
	}
	p := startPreview(t, reg)
	c := p.client(t)

	tests := []struct {
		name       string
		host       string
		wantLookup bool // a well-formed token reaches the registry
	}{
		{"unissued token", fmt.Sprintf("%s.localhost:%d", unknown, p.port), true},
		{"no token", fmt.Sprintf("localhost:%d", p.port), false},
		{"malformed token", fmt.Sprintf("not-a-token.localhost:%d", p.port), false},
		{"short token", fmt.Sprintf("%s.localhost:%d", known[:10], p.port), false},
		{"known token under another domain", fmt.Sprintf("%s.example.com:%d", known, p.port), false},
		{"known token not first label", fmt.Sprintf("x.%s.localhost:%d", known, p.port), false},
		{"IP literal", fmt.Sprintf("127.0.0.1:%d", p.port), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := reg.count()
			req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/", p.port), nil)
			req.Host = tt.host
			res, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != http.StatusNotFound {
				t.Errorf("status = %d, want 404", res.StatusCode)
			}
			if !strings.Contains(string(body), "This preview does not exist") {
				t.Errorf("body does not say the preview does not exist:\n%s", body)
			}
			for _, tok := range []string{known, unknown, known[:10]} {
				if strings.Contains(string(body), tok) {
					t.Errorf("404 page contains a token %q:\n%s", tok, body)
				}
			}
			if got := reg.count() > before; got != tt.wantLookup {
				t.Errorf("registry consulted = %v, want %v", got, tt.wantLookup)
			}
		})
	}
	if logs := p.logs.String(); strings.Contains(logs, known) || strings.Contains(logs, unknown) {
		t.Errorf("server log contains a full token:\n%s", logs)
	}
}

// A token in upper case or with a trailing dot is the same DNS name.
func TestHostIsCaseInsensitive(t *testing.T) {
	p, tok := serving(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	for _, host := range []string{
		strings.ToUpper(tok) + ".LocalHost",
		tok + ".localhost.",
		fmt.Sprintf("%s.localhost:%d", tok, p.port),
	} {
		req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/", p.port), nil)
		req.Host = host
		res, err := p.client(t).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK || string(body) != "ok" {
			t.Errorf("Host %q: got %d %q, want 200 \"ok\"", strings.ReplaceAll(host, tok, "TOKEN"), res.StatusCode, body)
		}
	}
}

func TestTargetDownIs502(t *testing.T) {
	reg := newRegistry()
	dead := deadPort(t)
	tok := reg.add(t, "alpha", dead)
	p := startPreview(t, reg)

	res, body := p.get(t, tok)
	if res.StatusCode != http.StatusBadGateway {
		t.Errorf("status = %d, want 502", res.StatusCode)
	}
	for _, want := range []string{"port is not serving", "alpha", fmt.Sprint(dead.Port())} {
		if !strings.Contains(string(body), want) {
			t.Errorf("502 page lacks %q:\n%s", want, body)
		}
	}
	if strings.Contains(string(body), tok) {
		t.Errorf("502 page contains the token:\n%s", body)
	}
}

// A registry that cannot answer must not make a live preview look gone.
func TestLookupFailureIs503NotAbsence(t *testing.T) {
	addr := startTarget(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	reg := newRegistry()
	tok := reg.add(t, "alpha", addr)
	reg.fail = errors.New("registry: database is locked")
	p := startPreview(t, reg)

	res, body := p.get(t, tok)
	if res.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("status = %d, want 503", res.StatusCode)
	}
	if strings.Contains(string(body), "does not exist") {
		t.Errorf("a lookup failure reads as absence:\n%s", body)
	}
}

// Each part of a response reaches the browser as the target writes it, also
// with a Content-Length, where a proxy buffers unless told to flush.
func TestStreamingArrivesIncrementally(t *testing.T) {
	const first, second = "data: first\n", "\ndata: second\n\n"
	tests := []struct {
		name, contentType string
		length            bool
	}{
		{"server-sent events", "text/event-stream", false},
		{"chunked", "text/plain", false},
		{"fixed length", "application/octet-stream", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			release := make(chan struct{})
			addr := startTarget(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tt.contentType)
				if tt.length {
					w.Header().Set("Content-Length", fmt.Sprint(len(first)+len(second)))
				}
				io.WriteString(w, first)
				http.NewResponseController(w).Flush()
				select {
				case <-release:
				case <-r.Context().Done():
					return
				}
				io.WriteString(w, second)
			}))
			var once sync.Once
			stop := func() { once.Do(func() { close(release) }) }
			t.Cleanup(stop) // before the target's Close, which waits for the handler

			reg := newRegistry()
			tok := reg.add(t, "alpha", addr)
			p := startPreview(t, reg)
			// The headers and the first part must arrive while the target
			// still holds the response open; a buffering proxy sends nothing
			// until the target finishes.
			type part struct {
				res  *http.Response
				br   *bufio.Reader
				line string
				err  error
			}
			got := make(chan part, 1)
			c := p.client(t)
			go func() {
				res, err := c.Get(p.URL(tok) + "events")
				if err != nil {
					got <- part{err: err}
					return
				}
				br := bufio.NewReader(res.Body)
				line, err := br.ReadString('\n')
				got <- part{res, br, line, err}
			}()
			var pt part
			select {
			case pt = <-got:
			case <-time.After(5 * time.Second):
				stop()
				if pt = <-got; pt.res != nil {
					pt.res.Body.Close()
				}
				t.Fatal("first part did not arrive before the target finished: the proxy buffers")
			}
			if pt.err != nil {
				t.Fatal(pt.err)
			}
			defer pt.res.Body.Close()
			if pt.line != first {
				t.Fatalf("first part = %q, want %q", pt.line, first)
			}
			br := pt.br
			stop()
			rest, err := io.ReadAll(br)
			if err != nil {
				t.Fatal(err)
			}
			if string(rest) != second {
				t.Errorf("rest = %q, want %q", rest, second)
			}
		})
	}
}

// echoTarget is a WebSocket echo server with coder/websocket's default
// Origin check, which passes only because the proxy keeps the browser's Host.
func echoTarget(t *testing.T) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			t.Errorf("target Accept: %v", err)
			return
		}
		defer c.CloseNow()
		for {
			typ, msg, err := c.Read(r.Context())
			if err != nil {
				return
			}
			if err := c.Write(r.Context(), typ, msg); err != nil {
				return
			}
		}
	})
}

func dialWS(t *testing.T, ctx context.Context, p *preview, tok string) *websocket.Conn {
	t.Helper()
	origin := strings.TrimSuffix(p.URL(tok), "/")
	ws, res, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(p.URL(tok), "http")+"ws", &websocket.DialOptions{
		HTTPClient: p.client(t),
		HTTPHeader: http.Header{"Origin": {origin}},
	})
	if err != nil {
		status := 0
		if res != nil {
			status = res.StatusCode
		}
		t.Fatalf("dial WebSocket through the preview: %v (status %d)", err, status)
	}
	return ws
}

func TestWebSocketEchoes(t *testing.T) {
	p, tok := serving(t, echoTarget(t))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	ws := dialWS(t, ctx, p, tok)
	defer ws.CloseNow()
	for i, msg := range []string{"hello", "", strings.Repeat("x", 30000)} {
		if err := ws.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		typ, got, err := ws.Read(ctx)
		if err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
		if typ != websocket.MessageText || string(got) != msg {
			t.Errorf("echo %d = %v %d bytes, want text %d bytes", i, typ, len(got), len(msg))
		}
	}
	if err := ws.Close(websocket.StatusNormalClosure, ""); err != nil {
		t.Errorf("close: %v", err)
	}
}

// Close ends hijacked connections too, waits for them, and is idempotent.
func TestCloseEndsWebSocketsAndIsIdempotent(t *testing.T) {
	p, tok := serving(t, echoTarget(t))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	ws := dialWS(t, ctx, p, tok)
	defer ws.CloseNow()
	if err := ws.Write(ctx, websocket.MessageText, []byte("ping")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ws.Read(ctx); err != nil {
		t.Fatal(err)
	}

	closed := make(chan error, 1)
	go func() { closed <- p.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return while a WebSocket was open")
	}
	if _, _, err := ws.Read(ctx); err == nil {
		t.Error("WebSocket still open after Close")
	}
	for i := 0; i < 3; i++ {
		if err := p.Close(); err != nil {
			t.Errorf("Close again: %v", err)
		}
	}
	select {
	case err := <-p.served:
		p.served <- err // for the cleanup's check
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after Close")
	}

	// Serve after Close refuses and closes the listener it was given.
	ln := deadListener(t)
	if err := p.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		t.Errorf("Serve after Close = %v, want http.ErrServerClosed", err)
	}
	if _, err := ln.Accept(); err == nil {
		t.Error("listener still open after Serve refused it")
	}
}

func TestConcurrentCloseWaitsForAll(t *testing.T) {
	reg := newRegistry()
	p := startPreview(t, reg)
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := p.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		}()
	}
	wg.Wait()
}

func TestNewRejectsBadConfig(t *testing.T) {
	lookup := newRegistry().Lookup
	tests := []struct {
		name string
		cfg  Config
	}{
		{"no template", Config{Lookup: lookup}},
		{"bad template", Config{URLTemplate: "http://localhost:7324/{token}", Lookup: lookup}},
		{"no lookup", Config{URLTemplate: "http://{token}.localhost:7324/"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(tt.cfg)
			if err == nil {
				s.Close()
				t.Fatal("New accepted the config, want an error")
			}
		})
	}
}
