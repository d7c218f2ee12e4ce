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
//     up to date from the shim's own files first (refresh).
//
// Layout: daemon is the HTTP face over managers with one job each.
// Below it, package daemon/sandboxes is the sandboxes manager (lifecycle,
// identities, private directories, cgroups and limits, network,
// checkpoints, the background adoption at start); daemon/apierr is the
// error vocabulary (status and wire code) the managers return and
// errors.go writes; daemon/registry is the source of truth under both.
// The session side (spawn, exec, attach, readers, control) is still in
// this package, and hands the sandboxes manager what it asks of sessions
// (sandboxhooks.go, sandboxes.Sessions), so the import arrow runs from
// here down, never back.
//
// Run (run.go) is wiring: named steps that each own what they start
// and hand back its stop; listeners.go opens and serves what runnerd
// listens on, shimcheck.go checks the shim before anything is served. The
// sandbox handlers (sandboxes.go, checkpoints.go) only decode, call one
// sandboxes.Manager method and encode; the session handlers
// (sessions.go, sessionlist.go, sessioncontrol.go) likewise call one
// lifecycle function; the streaming ones (attach.go, streams.go,
// exec.go) drive a session through the same functions. The session
// lifecycle takes a context and plain arguments: spawn.go (starting a
// session; netns.go checks it runs in its sandbox's namespace),
// sessionops.go (looking up, describing and reaching one),
// sessionlist.go (listing them), sessioncontrol.go (stdin, resize,
// signals), sessionstate.go (repairing its record from its shim),
// stopping.go (terminate and delete), recovery.go (what runnerd repairs
// at start and the retention janitor), commits.go (registry commits made
// after the answer). The host claim (claim.go: identity range, cgroup
// root, nftables table against the host's other runnerds) runs before
// any manager exists and stays here.
package daemon
