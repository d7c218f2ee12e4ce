// Package guest is the shim transport: it turns a hosted provider's one
// primitive, "run argv in the sandbox with stdin, stream its stdout, tell
// me its exit status" (an [Executor]), into the session half of the
// adapter contract, by driving runner-shim's subcommands in the guest
// (docs/frames.md, "runner-shim's command line"). A provider package
// (adapter/e2b) supplies the Executor and its control plane (create, get,
// list, destroy); everything about sessions is shared from here, in the
// manner of go-cloud's blob and its per-provider drivers.
//
// What it does, per sandbox (one [Guest] each):
//
//   - install-or-verify: before its first call it asks the guest's
//     runner-shim its version and refuses a mismatch (a *ProviderError
//     naming both versions); a missing runner-shim is installed through
//     Config.Install when the provider can, then verified. Once verified,
//     never asked again.
//   - spawn: runner-shim spawn answers only once the command runs (the
//     spawn-ack the seeds' E2B adapter lacked), so stdin written after
//     Spawn returns is never lost; a session id is minted client-side when
//     the caller gives none, so a retried spawn after an uncertain answer
//     attaches instead of starting a second process.
//   - attach: runner-shim attach --ack --lease, decoded with
//     adapter/stream.NewDecoderConn and driven by adapter/stream.New,
//     which reattaches from its cursors after a cut and after each lease's
//     end. Every attach process in the guest ends by its lease even if the
//     provider never stops it (E2B's envd does not kill a process whose
//     client went away), and the Executor's lifetime bounds it again.
//   - stdin, close-stdin, resize, signal, terminate, list (start order,
//     byte counts), exec (a session with stdin at EOF, read to its end).
//   - error mapping: runner-shim's JSON error codes are the contract's
//     (adapter/stream.KindError); a session's not_found from the guest's
//     shim is definitive (its root is the registry of its sessions); a
//     transport failure of the Executor stays what the provider said it
//     is, and a call that may have taken effect is uncertain.
//
// Invariants: guest imports only the standard library, adapter,
// adapter/stream and wire (deps_test.go). A lost session is never an exit;
// an error frame is never an exit; a lease end is never a terminal frame
// for the consumer. A Guest's goroutines are the attach executions it
// started; Close stops and waits for them.
package guest
