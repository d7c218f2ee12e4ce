package preview

import (
	"net/http"
	"net/netip"
	"testing"
)

// A token whose target is the preview listener itself (a URL minted for
// the listener's own port, or a sandbox port that forwards to a preview)
// must not recurse: the second pass is refused with 508, after exactly two
// lookups, and the browser gets that answer.
func TestProxyRefusesLoops(t *testing.T) {
	reg := newRegistry()
	p := startPreview(t, reg)
	tok := reg.add(t, "self", netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(p.port)))
	res, _ := p.get(t, tok)
	if res.StatusCode != http.StatusLoopDetected {
		t.Errorf("status = %d, want %d (loop refused)", res.StatusCode, http.StatusLoopDetected)
	}
	if n := reg.count(); n != 1 {
		t.Errorf("lookups = %d, want 1: the looped request must be refused before its token is looked up", n)
	}
}

// The proxy marks what it forwards, so the next preview proxy on the path
// can refuse it.
func TestProxyMarksForwardedRequests(t *testing.T) {
	got, p, tok := recorded(t)
	p.get(t, tok)
	in, _ := got.mustLast(t)
	if in.Header.Get(HopHeader) == "" {
		t.Errorf("forwarded request lacks %s", HopHeader)
	}
}
