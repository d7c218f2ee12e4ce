// Package launch is what runnerd (and runner-shim's spawn) starts and
// drives shims with: the daemon-side half of the shim, as containerd's
// shim manager is to its shim process.
//
// Pool is the one way a shim starts: Pool.Start through a warm shim when
// one is idle and cold otherwise (a Pool of size 0 is always cold), and
// Prepare/Prepared.Start, the same start cut in two around a caller's
// commit. Dial and DialFor give a Client for a session's control socket;
// DialFor bounds the errand by a named Budget, the one table of timeouts
// runnerd keeps with its shims.
//
// Invariants:
//
//   - Spawn-ack: a start returns only once the command's execve
//     succeeded (the shim's readiness line), or with the start error (a
//     *StartError, its errno and phase preserved across the process
//     boundary); a start that may still come up is told apart (ctx's
//     error, or a StartError without shim pid or phase).
//   - Detached: every shim is started through a short-lived intermediate
//     in a new session, so it survives its launcher; a warm shim exits on
//     EOF of its socket, so a crashed launcher leaves none idle.
//   - It never imports the supervisor (package shim): it runs the shim
//     program by its argv (the exe prefix) and speaks shim/internal/proto.
package launch
