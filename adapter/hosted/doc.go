// Package hosted is the portable hosted adapter: adapter.Adapter written
// once for every provider whose sandboxes run runner-shim (E2B, Daytona,
// Sprites), over a small per-provider [Driver], in the manner of
// go-cloud's blob.Bucket over driver.Bucket.
//
// What the portable [Adapter] does, so that no provider writes it again:
//
//   - argument and handle checks: sandbox names are DNS labels
//     ([ValidName]); a handle of another provider, or without an id, is
//     *adapter.InvalidError; a closed adapter refuses every call.
//   - capability gating: a call behind a capability the driver does not
//     advertise (tty, attach, terminate_session, a network policy at
//     create) is adapter.ErrNotSupported before the driver is asked.
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
// optional calls a provider can honestly deliver (Suspend and Resume,
// Checkpoint and Restore, PublicURL) are methods of the provider's own
// adapter type, which embeds *Adapter and advertises them.
//
// Invariants: hosted imports only the standard library, adapter,
// adapter/guest, adapter/stream and wire (deps_test.go). It never
// returns adapter.ErrNotFound of its own accord except for a handle whose
// cached incarnation carries another name; every other not_found is the
// driver's (its source of truth said so). Its goroutines are the Guests'
// attaches; Close stops and waits for them.
package hosted
