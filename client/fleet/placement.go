package fleet

// Placement: power of two choices over the listed runners by free
// capacity, Place, and the create that settles a placement's accounting.

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"math/big"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/client"
)

// unbounded stands for the free sandboxes of a runner without a bound, so
// that among unbounded runners the least loaded wins.
const unbounded = 1 << 40

// free is m's free sandbox count as this pool sees it: the report less
// what the pool placed since and has in flight. Caller holds p.mu.
func (m *member) free() int {
	max := m.cap.MaxSandboxes
	if max <= 0 {
		max = unbounded
	}
	return max - m.cap.Sandboxes - m.placed - m.inflight
}

// ErrExhausted is returned by Place when every listed runner answered
// exhausted or has no free capacity. It unwraps to
// *adapter.UnavailableError.
var ErrExhausted = &adapter.UnavailableError{Detail: "fleet: every runner is exhausted"}

// pick chooses a runner for a placement by two random choices among the
// candidates (listed, answering, not full, not in skip), and counts the
// placement as in flight there. Caller must call done with the outcome.
func (p *Pool) pick(skip map[string]bool) (*member, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var cand []*member
	for _, m := range p.members {
		if m.listed && !m.cordoned && m.ad != nil && m.capOK && !m.full && !skip[m.name] && m.free() > 0 {
			cand = append(cand, m)
		}
	}
	if len(cand) == 0 {
		return nil, false
	}
	a := cand[randN(len(cand))]
	if len(cand) > 1 {
		b := cand[randN(len(cand)-1)]
		if b == a {
			b = cand[len(cand)-1]
		}
		if b.free() > a.free() {
			a = b
		}
	}
	a.inflight++
	return a, true
}

func randN(n int) int {
	v, err := rand.Int(rand.Reader, big.NewInt(int64(n)))
	if err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return int(v.Int64())
}

// Place creates a sandbox named "<runner>-<prefix>-<8 hex>" on a runner
// placement picks. A runner that answers exhausted is skipped and the next
// pick tried; any other failure is returned as is (its outcome may be
// unknown, and the name names that runner: retry with Create and the
// handle's name, never Place). ErrExhausted when no runner takes it.
func (p *Pool) Place(ctx context.Context, prefix string, opts adapter.CreateOptions) (adapter.Handle, error) {
	skip := map[string]bool{}
	for {
		m, ok := p.pick(skip)
		if !ok {
			return adapter.Handle{}, ErrExhausted
		}
		h, err := p.create(ctx, m, client.NewName(m.name, prefix), opts)
		var ae *client.APIError
		if errors.As(err, &ae) && ae.Exhausted {
			skip[m.name] = true
			continue
		}
		return h, err
	}
}

// create runs one placement's create on m and settles its accounting.
func (p *Pool) create(ctx context.Context, m *member, name string, opts adapter.CreateOptions) (adapter.Handle, error) {
	p.mu.Lock()
	ad := m.ad
	if ad == nil {
		// Replaced by a refresh since it was routed, and not yet answered.
		m.inflight--
		p.mu.Unlock()
		return adapter.Handle{}, &adapter.UnavailableError{Detail: fmt.Sprintf("runner %s of sandbox %s has not answered", m.name, name)}
	}
	p.mu.Unlock()
	h, err := ad.Create(ctx, name, opts)
	var ae *client.APIError
	p.mu.Lock()
	m.inflight--
	switch {
	case err == nil:
		m.placed++
	case errors.As(err, &ae) && ae.Exhausted:
		m.full = true
	}
	p.mu.Unlock()
	return h, err
}
