// Package sprites is the Sprites-specific layer beneath the shim transport:
// a client for the Sprites API (https://api.sprites.dev, Bearer token):
// sprites (create, get, paged list, delete), the filesystem endpoints used
// to upload runner-shim (fs/write, fs/read), the network policy, the URL
// settings, checkpoints (create, list, get, restore: NDJSON progress), and
// exec over a WebSocket with the binary stream protocol.
//
// It is written from the public sources: the Sprites API v1 reference
// (paths, query parameters, response schemas, the exec frame table, the
// session_info and exit JSON messages) and the Go SDK superfly/sprites-go
// (websocket.go: stream ids 0..5, the one-byte exit payload, the resize and
// signal control messages, the X-Sprite-Capabilities header; exec.go: the
// cmd/path/env/dir/tty/rows/cols/stdin query; filesystem.go: fs/write's
// workingDir, mode and mkdirParents; errors.go: the {error, message}
// error body and Retry-After; checkpoint.go and types.go: the checkpoint
// calls and their stream; session.go: the exec session list).
//
// # Invariants
//
//   - Every error this package returns carries, after errors.Is / errors.As,
//     exactly one kind of the adapter taxonomy (see errors.go), or a context
//     error when the caller's context ended first. [adapter.ErrNotFound] is
//     given only for a 404 with the API's own {"error":"sprite not found"}
//     body on GET of a sprite.
//   - An exec's exit code comes only from an exit frame (stream 3, whose
//     payload is ONE byte) or, with a TTY, the JSON exit message (without
//     one that message is not the end: output follows it). A session that ends
//     without one (Sprites closes about 30 % of fast commands with status
//     1000 and no exit frame) is an error wrapping [ErrNoExit]: never exit 0.
//   - The token travels only in the Authorization header, never in a URL
//     (the WebSocket upgrade included) and never across a redirect (none is
//     followed). It never appears in errors, logs or any fmt / JSON / slog
//     rendering of this package's values ([Secret] redacts itself). Errors
//     never quote a request URL (an exec URL carries the argv and env).
//
// # The contract adapter
//
// [Adapter] (adapter.go) implements adapter.Adapter over this client and
// the shim transport, adapter/guest: sprites through the API (the
// caller's name is the sprite's name; a duplicate create adopts what Get
// shows; every call on a handle confirms its incarnation with Get),
// sessions through runner-shim, uploaded with fs/write at create (Sprites
// has no custom images) and run over the exec WebSocket. It advertises
// attach, tty, terminate_session, checkpoint and public_url (port 8080,
// the sprite's one URL): no suspend call exists and the DNS-based network
// policy has not passed the egress probe. The exec WebSocket is pinged
// every 15 s and dropped at once when a call is over: Sprites holds the
// socket about 5 s after the exit byte before it answers a close, and the
// SDKs never wait for that answer.
//
// A missing exit frame ([ErrNoExit]) is survived, never papered over:
// runner-shim's one-line JSON answer is each call's outcome
// (guest.ErrNoStatus); a call whose answer was lost too is run again only
// when idempotent (spawn with the same --id, version, list, status,
// close-stdin, resize, terminate), and a write is an uncertain
// *adapter.UnavailableError. docs/providers/sprites.md maps every call
// and every error.
//
// Exec over the WebSocket is in exec.go (options, frames, Exec and Run)
// and execsession.go (a running Session: receive, stdin, resize, signals).
package sprites
