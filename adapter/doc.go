// Package adapter is the provider-neutral sandbox contract: one interface
// through which a control plane drives any sandbox provider (the runner, a
// hosted platform, the in-memory fake), the closed error taxonomy, the
// capability vocabulary, retry, and a registry. This comment is normative:
// where an adapter, its docs or a test disagree with it, this text wins, and
// package [github.com/agentrunner/runner/adapter/conformance] is its
// executable form.
//
// It imports only the standard library and knows nothing of any provider.
//
// # Call sites never name an adapter
//
// A host registers adapters in a [Registry]. Creation-side code looks up a
// provider by name; everything else dispatches on the Provider carried by
// a [Handle]:
//
//	a, err := reg.Lookup("runner")
//	h, err := a.Create(ctx, "agent-7f3a", adapter.CreateOptions{})
//	res, err := a.Exec(ctx, h, adapter.Shell("uname -a"))
//	a, err = reg.For(h) // later, from a persisted handle
//
// # The ten requirements, as rules for every adapter
//
//   - exit-truth: every command ends with exactly one terminal frame, on the
//     streaming path ([Adapter.Spawn], [Adapter.Attach]) as on the blocking
//     one ([Adapter.Exec]), carrying the true [Exit]. A death by signal has
//     Code -1 and a Signal, so it can never read as 0. A stream that ends
//     without the exit being known ends with an error frame (a transport
//     *UnavailableError, or ErrLost), never with an invented exit. No data
//     frame follows the terminal frame.
//   - replay-cursor: a session's output is a journal per stream (stdout and
//     stderr kept apart). [Adapter.Attach] replays from byte zero or from a
//     [Cursor]; data frames carry their byte Offset, so a reader that
//     resumes at the byte count it persisted neither duplicates nor drops a
//     byte. A cursor behind retained data is ErrTruncated, beyond the end
//     *InvalidError; never a silent mid-line start.
//   - detached-sessions: Spawn is detachable; [Stream.Close] detaches the
//     local transport only; [Adapter.Sessions] lists; Attach rejoins by id.
//     A session's life never depends on a request's context or on an
//     attached reader.
//   - absence-definitive: ErrNotFound is returned only when the provider's
//     own authority says the sandbox (or session) does not exist. Every
//     failure that proves nothing (partition, throttle, expired
//     credential, 5xx, a proxy's 404, a timeout) is another kind, so a
//     reaper that destroys on ErrNotFound never destroys a live sandbox.
//     The definitive answers are exactly ErrNotFound and ErrLost.
//   - stdin-total: [Adapter.WriteStdin] to an exited command returns
//     ErrCommandExited, never a transport error; a write never sends EOF;
//     [Adapter.CloseStdin] sends one real EOF, on demand.
//   - named-create: the caller names the sandbox; [Adapter.Create] of an
//     existing name adopts it. Two concurrent creates of one name give one
//     sandbox and identical handles.
//   - park-not-expire: with CapSuspend, Suspend keeps the disk at storage
//     cost and nothing expires a parked sandbox; Resume returns the same
//     disk or *RestoreFailedError, never a fresh disk.
//   - honest-listing: [Adapter.List] pages with a continuation token and
//     terminates; a listing that cannot be completed is an error, never a
//     short page that looks whole. [ListAll] keeps that property.
//   - egress-deny: with CapNetworkPolicy, an empty allowlist denies all
//     egress, DNS and raw IPs included; it is never a no-op.
//   - url-or-nothing: with CapPublicURL, [Adapter.PublicURL] returns a URL a
//     browser opens with no provider credential; otherwise ErrNotSupported,
//     never a guessed hostname.
//
// # Advertise or refuse, never pretend
//
// [Adapter.Capabilities] returns the optional features an adapter delivers
// ([CapSuspend], [CapNetworkPolicy], [CapCheckpoint], [CapAttach], [CapTTY],
// [CapPublicURL], [CapTerminateSession]). Callers see every optional
// operation as a method of the one [Adapter] interface, so that the refusal
// is an answer: every call behind a capability that is not advertised
// returns ErrNotSupported, and a capability that is advertised does what it
// says. A host shapes its lifecycle to the set: a backend that cannot park
// gets destroy-on-idle, not a fake park.
//
// # Drivers and the portable type
//
// A provider does not implement [Adapter] itself: it writes a [Driver] (the
// core every provider has) and, for each optional feature it delivers, one
// small interface ([Attacher], [Resizer], [Terminator], [Suspender],
// [Checkpointer], [NetworkPolicer], [PublicURLer], [Forker]), and [New]
// wraps it in the portable [Sandboxes], as go-cloud's blob.Bucket wraps
// driver.Bucket. Fork is a method of Sandboxes only, not of [Adapter]
// (whose other implementations, the hosted providers' and the fleet, do
// not fork): a caller reaches it through *Sandboxes or an interface of
// its own, as the conformance suite does.
// New finds the optional interfaces once; a capability is advertised only
// when the driver implements its interface (and, for a [Declarer] whose set
// is known at run time, declares it). Sandboxes does once what every
// provider would repeat: names, handles, capability gates, option checks,
// the classification of an error outside the taxonomy, and (with
// [Options.Retry]) retries of the idempotent calls. runnerd's client, the
// fake and the hosted providers are drivers under it;
// conformance.OverDriver runs the suite on a bare driver.
//
// # Errors
//
// Every error is one kind of the contract's closed taxonomy (the one the
// Elixir sandbox library this package ports defines), matched with
// errors.Is (sentinels) or errors.As (typed errors with detail):
// ErrNotFound, ErrTruncated, ErrNotSupported, ErrCommandExited,
// *RateLimitedError, *UnavailableError, *DeniedError, *InvalidError,
// *RestoreFailedError, *WriteFailedError and *ProviderError; plus ErrLost
// for a session that ended without an exit record, and the caller's own
// context errors. Each typed error also matches its kind sentinel
// (errors.Is(err, ErrUnavailable)). [Transient] is true for rate_limited and
// unavailable only; [WithBackoff] retries those for idempotent calls.
// [KindOf] gives the wire name of a kind.
//
// # Frames
//
// A [Stream] delivers [Frame]s on a bounded channel, so a slow consumer
// slows only its own transport, never the command. Data frames carry their
// [StreamName], the byte Offset of their first byte, and the bytes. Exactly
// one terminal frame (Exit or Err) ends each stream its consumer does not
// close, and the channel closes after it.
//
// # Handles and secrets
//
// A [Handle] carries the provider, the caller's name, the incarnation id,
// and [Private] data the adapter needs (tokens, routes). Private prints as
// "[private]" under every fmt verb, slog handler and JSON encoding.
//
// # Terminate and stop
//
// [Adapter.TerminateSession] (grace [MinGrace] to [MaxGrace], SIGTERM then
// SIGKILL) returns only when the final frame is recorded; an uncertain
// outcome is *UnavailableError and the host must not reuse the session
// while it is uncertain. A confirmed stop says nothing about whether the
// command's work succeeded. [Stream.Close] only detaches the local
// transport. Turn deadlines and durable recovery belong to the host.
package adapter
