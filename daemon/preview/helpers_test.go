package preview

import (
	"io"
	"net/http"
	"testing"
)

// get fetches the preview URL of tok through p and returns the response
// with its whole body, read and closed.
func (p *preview) get(t *testing.T, tok string) (*http.Response, []byte) {
	t.Helper()
	res, err := p.client(t).Get(p.URL(tok))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	return res, body
}

// serving starts a target serving h, registers it as sandbox alpha and
// starts a preview over that registry; it returns the preview and
// alpha's token.
func serving(t *testing.T, h http.Handler) (*preview, string) {
	t.Helper()
	addr := startTarget(t, h)
	reg := newRegistry()
	tok := reg.add(t, "alpha", addr)
	return startPreview(t, reg), tok
}

// recorded is serving a target that records every request it gets.
func recorded(t *testing.T) (*seen, *preview, string) {
	t.Helper()
	var got seen
	p, tok := serving(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got.record(r) }))
	return &got, p, tok
}
