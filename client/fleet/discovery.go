package fleet

// Discovery's side of the pool: the loop that refreshes on a tick or a
// push, Refresh (which runners exist, their capacity reports) and Runners.

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/agentrunner/runner/client"
)

// pushTimeout bounds a refresh a discovery's notice started when the
// periodic refresh is off.
const pushTimeout = 10 * time.Second

// loop refreshes at every tick (unless Refresh is negative) and at every
// notice of changed (nil: none), until Close.
func (p *Pool) loop(changed <-chan struct{}) {
	defer close(p.done)
	var tick <-chan time.Time
	timeout := pushTimeout
	if p.opts.Refresh > 0 {
		t := time.NewTicker(p.opts.Refresh)
		defer t.Stop()
		tick, timeout = t.C, p.opts.Refresh
	}
	for {
		select {
		case <-p.stop:
			return
		case <-tick:
		case <-changed:
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		go func() { // ends the refresh when Close is called
			select {
			case <-p.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		if err := p.Refresh(ctx); err != nil {
			p.log.Warn("fleet refresh failed", "err", err)
		}
		cancel()
	}
}

// Refresh asks discovery for the runners and each listed runner for its
// capacity now. A runner that does not answer stays listed (its
// sandboxes are routed to it and fail as it fails) but takes no placement
// until it answers.
func (p *Pool) Refresh(ctx context.Context) error {
	rs, err := p.disc.Runners(ctx)
	if err != nil {
		return fmt.Errorf("discover runners: %w", err)
	}
	seen := map[string]bool{}
	for _, r := range rs {
		ep := r.Endpoint
		if !runnerName.MatchString(ep.Name) {
			return fmt.Errorf("discover runners: runner name %q: want 1-20 of [a-z0-9]", ep.Name)
		}
		seen[ep.Name] = true
	}
	p.mu.Lock()
	var stale []*client.Client
	for _, r := range rs {
		ep := r.Endpoint
		m := p.members[ep.Name]
		if m != nil && m.ep != ep {
			// Same runner, new address or token (a restarted pod): the
			// route is the name, so only the connection changes.
			stale = append(stale, m.c)
			m = nil
		}
		if m == nil {
			c, err := client.New(ep.URL, ep.Token, p.opts.Adapter.Client)
			if err != nil {
				p.mu.Unlock()
				return fmt.Errorf("discover runners: runner %s: %w", ep.Name, err)
			}
			m = &member{name: ep.Name, ep: ep, c: c}
			p.members[ep.Name] = m
		}
		m.listed, m.cordoned = true, r.Cordoned
	}
	for name, m := range p.members {
		if !seen[name] {
			m.listed = false
		}
	}
	todo := make([]*member, 0, len(p.members))
	for _, m := range p.members {
		if m.listed {
			todo = append(todo, m)
		}
	}
	p.mu.Unlock()
	for _, c := range stale {
		c.Close()
	}
	var wg sync.WaitGroup
	for _, m := range todo {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.refreshMember(ctx, m)
		}()
	}
	wg.Wait()
	return nil
}

func (p *Pool) refreshMember(ctx context.Context, m *member) {
	p.mu.Lock()
	ad, c := m.ad, m.c
	p.mu.Unlock()
	if ad == nil {
		a, err := client.NewAdapter(ctx, c, p.opts.Adapter)
		if err != nil {
			p.log.Warn("fleet runner does not answer", "runner", m.name, "err", err)
			return
		}
		ad = a
	}
	cp, err := c.Capacity(ctx)
	p.mu.Lock()
	defer p.mu.Unlock()
	if m.c != c {
		return // replaced meanwhile
	}
	m.ad = ad
	if err != nil {
		p.log.Warn("fleet runner capacity", "runner", m.name, "err", err)
		m.capOK = false
		return
	}
	m.cap, m.capOK, m.placed, m.full = cp, true, 0, cp.Exhausted
}

// Runners returns the names of the runners that take new sandboxes now
// (listed by discovery, not cordoned), sorted.
func (p *Pool) Runners() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for name, m := range p.members {
		if m.listed && !m.cordoned {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}
