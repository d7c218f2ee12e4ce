// Package fleet is the runner adapter over a changing set of runnerds:
// discovery says which hosts exist and take new sandboxes, placement picks
// one for each new sandbox, and routing sends every later call to the host
// the sandbox's name names.
//
// Invariants:
//   - Sandboxes never move. A sandbox name carries its runner
//     ("<runner>-<rest>", client.NewName), so a name keeps its route
//     whatever discovery says later.
//   - Absence stays definitive. A runner that discovery no longer lists
//     (down, NotReady, deleted) makes its sandboxes' calls
//     *adapter.UnavailableError, never adapter.ErrNotFound: only the runner
//     itself can say a sandbox is gone.
//   - Placement is power of two choices over the runners discovery lists,
//     by each one's reported free capacity (GET /v1/capacity) less the
//     placements this pool has in flight or made since that report. A
//     cordoned runner takes no placement but keeps serving its sandboxes; a
//     runner that answers "exhausted" is skipped for the rest of the
//     placement and until its next report.
//
// This package depends on no Kubernetes module: Discovery is the seam,
// [Static] the list a control plane already has, and package
// client/fleet/k8s the Kubernetes implementation.
package fleet

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/wire"
)

// Runner is one runnerd discovery lists.
type Runner struct {
	client.Endpoint
	// Cordoned runners take no new sandboxes; calls on their sandboxes
	// are still routed to them (running sessions stay until the
	// operator drains the host).
	Cordoned bool
}

// Discovery lists the runners that exist now. A runner it stops listing
// keeps its name's route: its sandboxes answer unavailable until it is
// listed again. Runners returns the whole set each time; an error leaves
// the pool's view as it was.
type Discovery interface {
	Runners(ctx context.Context) ([]Runner, error)
}

// Notifier is a Discovery that knows when its list changed (a watch):
// the pool refreshes as soon as Changed receives, besides its periodic
// refresh. The channel is never closed; a notice may stand for several
// changes.
type Notifier interface {
	Discovery
	Changed() <-chan struct{}
}

// Static is a fixed list of runners, none cordoned: the pool of a control
// plane that names its hosts itself.
type Static []client.Endpoint

// Runners returns the list.
func (s Static) Runners(context.Context) ([]Runner, error) {
	out := make([]Runner, len(s))
	for i, ep := range s {
		out[i] = Runner{Endpoint: ep}
	}
	return out, nil
}

// DefaultRefresh is Options.Refresh when it is 0.
const DefaultRefresh = 5 * time.Second

// Options tune a [Pool]. The zero value is usable.
type Options struct {
	// Adapter are the options of each runner's adapter (and client).
	Adapter client.AdapterOptions
	// Refresh is how often the pool asks discovery and every listed
	// runner's capacity; 0 means DefaultRefresh, negative never (call
	// Pool.Refresh). A Notifier's notices refresh at once either way.
	Refresh time.Duration
	// Logger receives refresh failures; nil discards them.
	Logger *slog.Logger
}

// member is one runner the pool has seen. Its fields are guarded by
// Pool.mu except name, which is fixed.
type member struct {
	name     string
	ep       client.Endpoint
	c        *client.Client
	ad       *client.Adapter // nil until its capabilities loaded
	listed   bool            // discovery lists it now
	cordoned bool            // listed, but takes no new sandboxes
	cap      wire.Capacity
	capOK    bool // cap is a report of this runner
	inflight int  // placements started and not finished
	placed   int  // placements finished since cap was read
	full     bool // answered exhausted since cap was read
}

// Pool is adapter.Adapter over the runners a Discovery lists. It is safe
// for concurrent use. Close stops its refresh and releases its clients;
// Streams it returned are owned by their callers.
type Pool struct {
	disc Discovery
	opts Options
	log  *slog.Logger

	mu      sync.Mutex // guards members, caps and the members' fields
	members map[string]*member
	caps    adapter.Capabilities // fixed at New

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

var _ adapter.Adapter = (*Pool)(nil)

var runnerName = regexp.MustCompile(`^[a-z0-9]{1,20}$`)

// New asks discovery once, and returns the pool over what it lists. The
// pool's capabilities are those every runner listed now advertises; New
// fails when discovery fails or lists no runner that answers. Unless
// Options.Refresh is negative it refreshes in the background until Close,
// and at once whenever a Notifier discovery says its list changed.
func New(ctx context.Context, d Discovery, opts Options) (*Pool, error) {
	if opts.Refresh == 0 {
		opts.Refresh = DefaultRefresh
	}
	p := &Pool{disc: d, opts: opts, log: opts.Logger, members: map[string]*member{},
		stop: make(chan struct{}), done: make(chan struct{})}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	if err := p.Refresh(ctx); err != nil {
		p.closeClients()
		return nil, err
	}
	count := map[adapter.Capability]int{}
	n := 0
	for _, m := range p.members {
		if m.ad == nil {
			continue
		}
		n++
		for _, c := range m.ad.Capabilities() {
			count[c]++
		}
	}
	if n == 0 {
		p.closeClients()
		return nil, &adapter.UnavailableError{Detail: "fleet: discovery lists no runner that answers"}
	}
	for _, c := range adapter.AllCapabilities() {
		if count[c] == n {
			p.caps = append(p.caps, c)
		}
	}
	n2, push := d.(Notifier)
	if opts.Refresh > 0 || push {
		var changed <-chan struct{}
		if push {
			changed = n2.Changed()
		}
		go p.loop(changed)
	} else {
		close(p.done)
	}
	return p, nil
}

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

// Close stops the refresh and releases the clients. It is idempotent.
func (p *Pool) Close() error {
	p.closeOnce.Do(func() {
		close(p.stop)
		<-p.done
		p.closeClients()
	})
	return nil
}

func (p *Pool) closeClients() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range p.members {
		m.c.Close()
	}
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

// NewName mints a name routed to runner, as client.NewName.
func (p *Pool) NewName(runner, prefix string) string { return client.NewName(runner, prefix) }

// Provider returns "runner".
func (p *Pool) Provider() string { return client.Provider }

// Capabilities returns what every runner listed at New advertised.
func (p *Pool) Capabilities() adapter.Capabilities { return slices.Clone(p.caps) }

// String describes the pool without secrets.
func (p *Pool) String() string { return "runner fleet [" + strings.Join(p.Runners(), ", ") + "]" }

// listedOn is a listed handle's private note of the runner that listed it.
type listedOn string

// route returns the adapter of the runner that holds name, or of the
// runner h was listed on.
func (p *Pool) route(name string, priv adapter.Private) (*client.Adapter, error) {
	runner, _, ok := strings.Cut(name, "-")
	if on, isListed := priv.Value().(listedOn); isListed {
		runner, ok = string(on), true
	}
	p.mu.Lock()
	m := p.members[runner]
	var ad *client.Adapter
	listed := false
	if m != nil {
		ad, listed = m.ad, m.listed
	}
	p.mu.Unlock()
	switch {
	case !ok || m == nil:
		// A runner this pool never saw: the name routes nowhere. It is
		// invalid, never not_found (absence is the runner's to say).
		return nil, &adapter.InvalidError{Detail: fmt.Sprintf("sandbox name %q carries no route of this fleet (want <runner>-<rest>)", name)}
	case !listed:
		return nil, &adapter.UnavailableError{Detail: fmt.Sprintf("runner %s of sandbox %s is not listed by discovery now", runner, name)}
	case ad == nil:
		return nil, &adapter.UnavailableError{Detail: fmt.Sprintf("runner %s of sandbox %s has not answered", runner, name)}
	}
	return ad, nil
}

func (p *Pool) routeH(h adapter.Handle) (*client.Adapter, error) {
	if h.Name == "" {
		return nil, &adapter.InvalidError{Detail: "zero handle"}
	}
	return p.route(h.Name, h.Private)
}

// Create implements adapter.Adapter: the sandbox goes on the runner its
// name names (mint names with Place or NewName). An exhausted runner's
// answer is *client.APIError with Exhausted set.
func (p *Pool) Create(ctx context.Context, name string, opts adapter.CreateOptions) (adapter.Handle, error) {
	if _, err := p.route(name, adapter.Private{}); err != nil {
		return adapter.Handle{}, err
	}
	runner, _, _ := strings.Cut(name, "-")
	p.mu.Lock()
	m := p.members[runner]
	m.inflight++
	p.mu.Unlock()
	return p.create(ctx, m, name, opts)
}

// Get implements adapter.Adapter.
func (p *Pool) Get(ctx context.Context, name string) (adapter.Handle, error) {
	ad, err := p.route(name, adapter.Private{})
	if err != nil {
		return adapter.Handle{}, err
	}
	return ad.Get(ctx, name)
}

// List implements adapter.Adapter: every runner the pool has seen, in
// name order. A runner not listed by discovery fails the listing (a
// listing without it would be short). Page tokens are the pool's own.
func (p *Pool) List(ctx context.Context, opts adapter.ListOptions) (adapter.Page, error) {
	p.mu.Lock()
	names := make([]string, 0, len(p.members))
	for name := range p.members {
		names = append(names, name)
	}
	p.mu.Unlock()
	slices.Sort(names)
	runner, tok := names[0], ""
	if opts.PageToken != "" {
		raw, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(opts.PageToken, "f1."))
		r, t, ok := strings.Cut(string(raw), "\n")
		if err != nil || !ok || !strings.HasPrefix(opts.PageToken, "f1.") || !slices.Contains(names, r) {
			return adapter.Page{}, &adapter.InvalidError{Detail: "page token not issued by this fleet"}
		}
		runner, tok = r, t
	}
	ad, err := p.route(runner+"-x", adapter.Private{})
	if err != nil {
		return adapter.Page{}, err
	}
	// The runner's own adapter pages one runner; its tokens are wrapped
	// with the runner's name.
	page, err := ad.List(ctx, adapter.ListOptions{PageSize: opts.PageSize, PageToken: tok})
	if err != nil {
		return adapter.Page{}, err
	}
	for i := range page.Handles {
		page.Handles[i].Private = adapter.NewPrivate(listedOn(runner))
	}
	enc := func(r, t string) string { return "f1." + base64.RawURLEncoding.EncodeToString([]byte(r+"\n"+t)) }
	switch i := slices.Index(names, runner); {
	case page.NextPageToken != "":
		page.NextPageToken = enc(runner, page.NextPageToken)
	case i+1 < len(names):
		page.NextPageToken = enc(names[i+1], "")
	}
	return page, nil
}

// Destroy implements adapter.Adapter.
func (p *Pool) Destroy(ctx context.Context, h adapter.Handle) error {
	ad, err := p.routeH(h)
	if err != nil {
		return err
	}
	return ad.Destroy(ctx, h)
}

// Exec implements adapter.Adapter.
func (p *Pool) Exec(ctx context.Context, h adapter.Handle, c adapter.Command) (adapter.Result, error) {
	ad, err := p.routeH(h)
	if err != nil {
		return adapter.Result{}, err
	}
	return ad.Exec(ctx, h, c)
}

// Spawn implements adapter.Adapter.
func (p *Pool) Spawn(ctx context.Context, h adapter.Handle, c adapter.Command, opts adapter.SpawnOptions) (adapter.Stream, error) {
	ad, err := p.routeH(h)
	if err != nil {
		return nil, err
	}
	return ad.Spawn(ctx, h, c, opts)
}

// Attach implements adapter.Adapter.
func (p *Pool) Attach(ctx context.Context, h adapter.Handle, id string, from adapter.Cursor) (adapter.Stream, error) {
	ad, err := p.routeH(h)
	if err != nil {
		return nil, err
	}
	return ad.Attach(ctx, h, id, from)
}

// Sessions implements adapter.Adapter.
func (p *Pool) Sessions(ctx context.Context, h adapter.Handle) ([]adapter.SessionInfo, error) {
	ad, err := p.routeH(h)
	if err != nil {
		return nil, err
	}
	return ad.Sessions(ctx, h)
}

// WriteStdin implements adapter.Adapter.
func (p *Pool) WriteStdin(ctx context.Context, h adapter.Handle, id string, b []byte) error {
	ad, err := p.routeH(h)
	if err != nil {
		return err
	}
	return ad.WriteStdin(ctx, h, id, b)
}

// CloseStdin implements adapter.Adapter.
func (p *Pool) CloseStdin(ctx context.Context, h adapter.Handle, id string) error {
	ad, err := p.routeH(h)
	if err != nil {
		return err
	}
	return ad.CloseStdin(ctx, h, id)
}

// Resize implements adapter.Adapter.
func (p *Pool) Resize(ctx context.Context, h adapter.Handle, id string, size adapter.TTYSize) error {
	ad, err := p.routeH(h)
	if err != nil {
		return err
	}
	return ad.Resize(ctx, h, id, size)
}

// TerminateSession implements adapter.Adapter.
func (p *Pool) TerminateSession(ctx context.Context, h adapter.Handle, id string, grace time.Duration) (adapter.Exit, error) {
	ad, err := p.routeH(h)
	if err != nil {
		return adapter.Exit{}, err
	}
	return ad.TerminateSession(ctx, h, id, grace)
}

// Suspend implements adapter.Adapter.
func (p *Pool) Suspend(ctx context.Context, h adapter.Handle) error {
	ad, err := p.routeH(h)
	if err != nil {
		return err
	}
	return ad.Suspend(ctx, h)
}

// Resume implements adapter.Adapter.
func (p *Pool) Resume(ctx context.Context, h adapter.Handle) error {
	ad, err := p.routeH(h)
	if err != nil {
		return err
	}
	return ad.Resume(ctx, h)
}

// Checkpoint implements adapter.Adapter: runnerd does not checkpoint.
func (p *Pool) Checkpoint(ctx context.Context, h adapter.Handle) (string, error) {
	return "", fmt.Errorf("checkpoint %s: %w", h.Name, adapter.ErrNotSupported)
}

// Restore implements adapter.Adapter: runnerd does not checkpoint.
func (p *Pool) Restore(ctx context.Context, h adapter.Handle, id string) error {
	return fmt.Errorf("restore %s: %w", h.Name, adapter.ErrNotSupported)
}

// SetNetworkPolicy implements adapter.Adapter.
func (p *Pool) SetNetworkPolicy(ctx context.Context, h adapter.Handle, np adapter.NetworkPolicy) error {
	ad, err := p.routeH(h)
	if err != nil {
		return err
	}
	return ad.SetNetworkPolicy(ctx, h, np)
}

// PublicURL implements adapter.Adapter.
func (p *Pool) PublicURL(ctx context.Context, h adapter.Handle, port int) (string, error) {
	ad, err := p.routeH(h)
	if err != nil {
		return "", err
	}
	return ad.PublicURL(ctx, h, port)
}
