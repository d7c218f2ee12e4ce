// Package hosted is the hosted core: the adapter.Driver every provider
// whose sandboxes run runner-shim (E2B, Daytona, Sprites) shares, over a
// small per-provider [Driver]. [New] wraps it in the portable
// adapter.Sandboxes, which checks names, handles, options and capabilities
// before any call reaches the core.
//
// What the core does, so that no provider writes it again:
//
//   - the incarnation check hosted addressing needs: a handle without an
//     id is *adapter.InvalidError, and a closed adapter refuses every call.
//   - create: creates of one name in this process are serialized; a
//     sandbox the driver made or adopted gets its transport and
//     runner-shim verified (or installed) before Create returns, and one
//     this call made that cannot be verified goes back to the driver
//     (Driver.Discard) so nothing half-made is left.
//   - the guest cache: one adapter/guest.Guest per sandbox incarnation
//     (keyed by id, checked against the handle's name), made from the
//     driver's [Transport] on first use and dropped by [Adapter.Forget].
//   - the session half: Exec, Spawn, Attach, Sessions, WriteStdin,
//     CloseStdin, Resize and TerminateSession delegate to that Guest.
//
// A driver supplies only what differs: its sandbox lifecycle (create or
// adopt by name, get, list, destroy), how a sandbox is opened for calls
// (its guest.Executor, install and readiness), and its error table. The
// optional calls a provider can honestly deliver are methods of its
// driver: New finds adapter.Suspender, adapter.Checkpointer,
// adapter.NetworkPolicer and adapter.PublicURLer on it once, and the
// capability behind each is advertised only when the driver both
// implements and declares it.
//
// Invariants: hosted imports only the standard library, adapter,
// adapter/guest, adapter/stream and wire (deps_test.go). It never
// returns adapter.ErrNotFound of its own accord except for a handle whose
// cached incarnation carries another name; every other not_found is the
// driver's (its source of truth said so). Its goroutines are the Guests'
// attaches; Close stops and waits for them.
package hosted
