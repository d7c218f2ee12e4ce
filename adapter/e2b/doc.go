// Package e2b is the E2B-specific layer beneath the shim transport: a
// client for E2B's control-plane REST API (sandboxes: create, get, paged
// list, delete, pause, resume, connect, timeout) and for envd, the daemon
// inside every sandbox: its process service, which speaks the Connect
// protocol, and its files endpoint.
//
// It is written from the public sources: e2b-dev/infra spec/openapi.yml
// (paths, schemas, the X-API-Key scheme, the X-Next-Token list cursor),
// e2b-dev/infra packages/envd/spec/process/process.proto (service
// process.Process), packages/envd/spec/envd.yaml (/files) and the E2B SDKs (e2b-dev/E2B packages/js-sdk and
// python-sdk: the envd port 49983, the sandbox host scheme, the
// X-Access-Token, E2b-Sandbox-Id and E2b-Sandbox-Port headers).
//
// # Invariants
//
//   - Every error this package returns carries, after errors.Is / errors.As,
//     exactly one kind of the adapter taxonomy (see errors.go), or a context
//     error when the caller's context ended first. [adapter.ErrNotFound] is
//     given only for a 404 with E2B's own error body on GET of a sandbox.
//   - Secrets (the API key, envd access tokens) travel only in request
//     headers, and never across a redirect (none is followed). They never
//     appear in URLs, errors, logs or in any fmt / JSON / slog rendering of
//     this package's values ([Secret] redacts itself).
//   - [Envd.Start] returns only after envd acknowledged the process with its
//     start event (pid): a caller may write stdin at once.
//   - The Connect envelope framing is written here (stdlib only); the codec
//     is Connect's JSON codec (protojson field names), which envd's
//     connect-go handlers serve beside the binary proto codec.
//
// # The contract adapter
//
// [Adapter] (adapter.go) implements adapter.Adapter over this client and
// the shim transport, adapter/guest: sandboxes through the control plane
// (the caller's name kept in metadata under [NameKey] and adopted on
// list, since E2B mints ids; get confirmed by GET; paged list; delete),
// sessions through runner-shim in the guest, run with envd's Start
// ([envdExec]). It advertises attach, tty and terminate_session only.
// Sandboxes are created secure (envd requires the access token) and with
// autoPause: a time to live that runs out pauses a sandbox, sessions and
// all, and never kills it; a lease (lease.go) renews the time to live
// while the adapter holds calls or streams, and the next use of a paused
// sandbox resumes it, so a paused sandbox is never not_found.
// docs/providers/e2b.md maps every call and every error and says what
// the time to live, pause and kill mean for sessions.
//
// The envd client is envd.go (the Envd type, its messages and unary
// calls), envdstream.go (a process's event Stream) and envdinput.go
// (StreamInput's ordered stdin).
package e2b
