package adapter

import (
	"context"
	"time"
)

// The driver seam, in the manner of go-cloud's driver.Bucket under
// blob.Bucket: a provider writes a [Driver] (the core every sandbox
// provider has) plus the optional interfaces below for the features it
// delivers, and [New] wraps it in the portable [Sandboxes], which does
// once what every provider would otherwise repeat: name and handle
// checks, capability gates, option checks (TTY size, cursor, grace,
// port), the classification of an error outside the taxonomy, and
// retries where the contract allows them.
//
// The seam lives in this package, not in a subpackage, because its
// methods speak this package's types (Handle, Command, Stream) and the
// portable type must see it: a driver package importing adapter and
// adapter importing it back would be a cycle.
//
// A driver method is called only after the portable type's checks
// passed: the name is valid (see [NameChecker]), the handle has a name
// and is this provider's (or names no provider), the command has a
// program, the capability behind the call is advertised, and the
// options are in range. A driver never checks those again. Every error
// a driver returns is already in the taxonomy (its own error table
// classified it at its boundary); the portable type turns one that is
// not into *ProviderError. Every driver method is safe for concurrent
// use.
type Driver interface {
	// Provider is the registry name, the Provider of every Handle.
	Provider() string
	// Create returns the sandbox named name, creating it when it does
	// not exist and adopting it when it does ([Adapter.Create]). A
	// network policy in opts reaches it only when the driver is a
	// [NetworkPolicer] and advertises it.
	Create(ctx context.Context, name string, opts CreateOptions) (Handle, error)
	// Get is [Adapter.Get].
	Get(ctx context.Context, name string) (Handle, error)
	// List is [Adapter.List]; opts.PageSize is not negative.
	List(ctx context.Context, opts ListOptions) (Page, error)
	// Destroy is [Adapter.Destroy].
	Destroy(ctx context.Context, h Handle) error
	// Exec is [Adapter.Exec].
	Exec(ctx context.Context, h Handle, c Command) (Result, error)
	// Spawn is [Adapter.Spawn]. opts.TTY reaches it only when CapTTY is
	// advertised, and then with a non-zero size.
	Spawn(ctx context.Context, h Handle, c Command, opts SpawnOptions) (Stream, error)
	// Sessions is [Adapter.Sessions].
	Sessions(ctx context.Context, h Handle) ([]SessionInfo, error)
	// WriteStdin is [Adapter.WriteStdin].
	WriteStdin(ctx context.Context, h Handle, id string, p []byte) error
	// CloseStdin is [Adapter.CloseStdin].
	CloseStdin(ctx context.Context, h Handle, id string) error
}

// Attacher is a driver that rejoins sessions from a cursor: CapAttach.
// from is never negative.
type Attacher interface {
	Attach(ctx context.Context, h Handle, id string, from Cursor) (Stream, error)
}

// Resizer is a driver that runs sessions on a terminal and resizes it:
// CapTTY. size is never zero.
type Resizer interface {
	Resize(ctx context.Context, h Handle, id string, size TTYSize) error
}

// Terminator is a driver that stops one session: CapTerminateSession.
// grace is within [MinGrace, MaxGrace].
type Terminator interface {
	TerminateSession(ctx context.Context, h Handle, id string, grace time.Duration) (Exit, error)
}

// Suspender is a driver that parks and resumes sandboxes with their
// disk: CapSuspend.
type Suspender interface {
	Suspend(ctx context.Context, h Handle) error
	Resume(ctx context.Context, h Handle) error
}

// Checkpointer is a driver that snapshots and restores a sandbox's disk:
// CapCheckpoint.
type Checkpointer interface {
	Checkpoint(ctx context.Context, h Handle) (string, error)
	Restore(ctx context.Context, h Handle, id string) error
}

// NetworkPolicer is a driver that enforces an egress allowlist, at
// create and later: CapNetworkPolicy.
type NetworkPolicer interface {
	SetNetworkPolicy(ctx context.Context, h Handle, p NetworkPolicy) error
}

// PublicURLer is a driver that serves a sandbox port to a browser:
// CapPublicURL. port is within 1-65535.
type PublicURLer interface {
	PublicURL(ctx context.Context, h Handle, port int) (string, error)
}

// FullDriver is a driver with every optional interface: runnerd's
// client, the fake and the hosted core are. It is a compile-time check
// (var _ adapter.FullDriver = (*driver)(nil)); which capabilities are
// advertised is still the driver's [Declarer] answer.
type FullDriver interface {
	Driver
	Attacher
	Resizer
	Terminator
	Suspender
	Checkpointer
	NetworkPolicer
	PublicURLer
	Declarer
}

// Declarer is a driver whose capabilities are known only at run time
// (runnerd tells its client with GET /v1/capabilities; a provider plan
// may lack a feature its driver implements). The portable type
// advertises a capability when the driver both implements its
// interface and declares it; a declared capability without its method
// is never advertised. A driver that is no Declarer advertises what it
// implements. Capabilities is called once, at [New].
type Declarer interface {
	Capabilities() Capabilities
}

// NameChecker is a driver with its own rule for sandbox names, checked
// on Create and Get in place of the default DNS label rule ([ValidName]).
// It returns *InvalidError for a name the provider cannot accept.
type NameChecker interface {
	CheckName(name string) error
}

// capabilityOf maps each capability to the test for the interface that
// delivers it.
var capabilityOf = []struct {
	c    Capability
	impl func(Driver) bool
}{
	{CapSuspend, func(d Driver) bool { _, ok := d.(Suspender); return ok }},
	{CapNetworkPolicy, func(d Driver) bool { _, ok := d.(NetworkPolicer); return ok }},
	{CapCheckpoint, func(d Driver) bool { _, ok := d.(Checkpointer); return ok }},
	{CapAttach, func(d Driver) bool { _, ok := d.(Attacher); return ok }},
	{CapTTY, func(d Driver) bool { _, ok := d.(Resizer); return ok }},
	{CapPublicURL, func(d Driver) bool { _, ok := d.(PublicURLer); return ok }},
	{CapTerminateSession, func(d Driver) bool { _, ok := d.(Terminator); return ok }},
	{CapFork, func(d Driver) bool { _, ok := d.(Forker); return ok }},
}

// ValidName reports whether name is a DNS label (1-63 of [a-z0-9-], not
// starting or ending with '-'): the names the contract promises, and the
// default rule of [Sandboxes].
func ValidName(name string) bool {
	if len(name) == 0 || len(name) > 63 || name[0] == '-' || name[len(name)-1] == '-' {
		return false
	}
	for _, c := range []byte(name) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}
