// Package fleet is the runner adapter over a changing set of runnerds:
// discovery says which hosts exist and take new sandboxes, placement picks
// one for each new sandbox, and routing sends every later call to the host
// the sandbox's name names.
//
// Invariants:
//   - A sandbox name carries its runner ("<runner>-<rest>",
//     client.NewName), so a name keeps its route whatever discovery says
//     later. Only a move (package client/fleet/move) changes it, and
//     records the new route (SetRoute, moved.go).
//   - Absence stays definitive. A runner that discovery no longer lists
//     (down, NotReady, deleted) makes its sandboxes' calls
//     *adapter.UnavailableError, never adapter.ErrNotFound: only the runner
//     itself can say a sandbox is gone. With Options.Routes, a runner's
//     not_found is checked against the recorded routes of moved sandboxes
//     first (moved.go).
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
//
// Files: fleet.go (the types, New and Close), discovery.go (refreshing
// the set of runners), placement.go (picking a runner for a new sandbox),
// routing.go (the adapter.Adapter methods, each sent to its runner),
// moved.go (routes of moved sandboxes, the runners a move talks to).
package fleet

import (
	"context"
	"log/slog"
	"regexp"
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
	// Routes, when set, is where moved sandboxes' routes are recorded
	// (package client/fleet/move's Store): a runner's not_found for a
	// name is checked against it before it is returned, and a destroy
	// reads it first (moved.go).
	Routes RouteSource
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
	moved   map[string]string    // sandbox name -> runner it moved to (moved.go)
	moving  map[string]bool      // sandboxes a move is archiving (moved.go)

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
		// The pool has no Fork (a fork must stay on its source's runner,
		// which routing by name does not promise): never advertised.
		if count[c] == n && c != adapter.CapFork {
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
