// Package daemon is runnerd: the HTTP+WebSocket API server, the sandbox
// registry's owner, and the manager of session shims. cmd/runnerd only
// parses flags into a Config and calls Run.
//
// Invariants:
//
//   - A session's lifetime never depends on runnerd: every command runs under
//     its own detached shim (package shim), so a stop, crash or upgrade of
//     runnerd never ends a turn. Run never kills a shim when it returns.
//   - Output has one path: runnerd reads the session journal (package
//     journal) at each client's own pace and never holds a session's output
//     beyond one bounded buffer per reader, so a slow client pays only for
//     itself.
//   - not_found is answered only when the registry definitively has no such
//     record; any failure to consult it is unavailable (see errors.go, the
//     one place that maps errors to HTTP status and wire code).
//   - Operations that change a sandbox's set of processes (create session,
//     suspend, destroy) hold that sandbox's lock, so a spawn never races a
//     destroy.
//   - Capabilities are advertised only when delivered; everything else
//     answers not_supported.
//   - No bearer token crosses a network in clear: a TCP listener off
//     loopback speaks TLS (tls.go) unless the operator said
//     InsecureListen; with a client CA both the client certificate and the
//     token are required.
//   - A session's record may trail its shim (a commit made after the answer,
//     deferredCommits, or a crash): whoever reads a live session brings it
//     up to date from the shim's own files first (sessions.Manager.Refresh).
//
// Layout: daemon is the HTTP face over managers with one job each:
// package daemon/sessions (spawn, exec, readers, stdin, control, bounds,
// listings, recovery, the shim gateway) above package daemon/sandboxes
// (lifecycle, identities, private directories, cgroups and limits,
// network, checkpoints, the background adoption at start), both over
// daemon/registry, the source of truth. daemon/apierr is the error
// vocabulary (status and wire code) the managers return and errors.go
// writes; daemon/internal/life is runnerd's lifetime (the context
// long-lived work ends on, and the count Run waits for). The import
// arrow runs daemon -> sessions -> sandboxes -> registry, never back:
// the sandboxes manager asks sessions through sandboxes.Sessions.
//
// Run (run.go) is wiring: named steps that each own what they start
// and hand back its stop; listeners.go opens and serves what runnerd
// listens on, shimcheck.go checks the shim before anything is served,
// claim.go claims the identity range, cgroup root and nftables table
// against the host's other runnerds before any manager exists,
// managers.go is what the managers get of Config. The handlers decode,
// call the managers and encode: sandboxroutes.go (the sandbox routes),
// sessionroutes.go (the session routes and exec), sessionarchive.go (a
// sandbox's ended sessions out and in, for a move); the streaming ones
// (attach.go, streams.go) frame a session's journal readers for a
// WebSocket or a chunked body.
// capacity.go admits creates under the host's capacity, requests.go logs
// and times every request, metrics.go exposes them.
package daemon
