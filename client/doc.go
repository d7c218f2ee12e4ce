// Package client drives runnerd over docs/protocol.md. It has two layers:
//
//   - [Client], the protocol-level client: one method per endpoint, wire
//     types in and out (package wire), a [FrameReader] for the WebSocket
//     attach and a [StreamBody] for the plain stream endpoint. The runner
//     CLI is built on it. [Discover] finds the local daemon and its token
//     the way runnerd picks its defaults.
//   - [Adapter], the runner adapter: adapter.Adapter over one runnerd or a
//     pool of them ([NewAdapter], [NewPool]), passing the conformance suite
//     of package adapter/conformance against a real daemon.
//
// It imports only adapter, wire, github.com/coder/websocket and the
// standard library (a dependency test holds that line).
//
// # Quick start
//
//	l, err := client.Discover()            // $RUNNERD_URL/$RUNNERD_TOKEN, else STATE/token
//	c, err := l.New(client.Options{})
//	defer c.Close()
//	sb, err := c.CreateSandbox(ctx, wire.CreateSandbox{Name: "web-1"})
//	res, err := c.Exec(ctx, "web-1", wire.Exec{Argv: []string{"sh", "-c", "echo hi"}})
//	s, _, err := c.CreateSession(ctx, "web-1", wire.CreateSession{ID: "turn-1", Argv: argv})
//	fr, err := c.Attach(ctx, "web-1", s.ID, client.Cursors{})
//	defer fr.Close()
//	for {
//		f, err := fr.Next() // data frames, then one terminal frame, then io.EOF
//		...
//	}
//
// # Invariants
//
//   - Absence is definitive only when runnerd says so: a 404 whose
//     Runner-Error header and decoded body both say not_found. Nothing else
//     becomes adapter.ErrNotFound.
//   - Every call has a connect deadline ([Options].ConnectTimeout) and a
//     request deadline ([Options].RequestTimeout, plus the wait the call
//     legitimately has: a terminate's grace, a suspend's or delete's stop).
//     Exec without a timeout is bounded by the caller's context and by a
//     liveness check of the daemon ([Options].ExecLiveness). An attach that
//     is silent for [Options].HeartbeatTimeout (runnerd sends heartbeats
//     after 15 s) is declared dead.
//   - A stream that ends without a terminal frame is a transport failure
//     (*adapter.UnavailableError), never an exit. Data frames carry their
//     offsets; attaching again from the persisted cursor loses and
//     duplicates nothing.
//   - The token is sent only in the Authorization header, never in a URL,
//     and no formatting verb of a Client, Adapter, Local or Handle prints
//     it; errors never contain it.
//   - Every goroutine the package starts has an owner that stops and waits
//     for it: a Stream's producer is stopped by Stream.Close (or ends after
//     the terminal frame); Exec's liveness watcher ends with the call.
//
// # Error mapping
//
// Every error is of the adapter taxonomy (errors.Is / errors.As). Answers
// runnerd produced are *APIError, which unwraps to the kind:
//
//	answer                                        error
//	404 + Runner-Error not_found + body not_found adapter.ErrNotFound (definitive)
//	404 without Runner-Error (a proxy's)          *adapter.UnavailableError
//	404 invalid ("no such route")                 *adapter.InvalidError
//	400/405/409/413 invalid                       *adapter.InvalidError
//	409 command_exited                            adapter.ErrCommandExited
//	416 truncated                                 adapter.ErrTruncated
//	501 not_supported                             adapter.ErrNotSupported
//	429 (any sender)                              *adapter.RateLimitedError{RetryAfter}
//	401 / 403 (any sender)                        *adapter.DeniedError
//	503 unavailable, any 5xx without the header   *adapter.UnavailableError
//	503 unavailable, uncertain                    *adapter.UnavailableError{Uncertain: true}
//	500 restore_failed                            *adapter.RestoreFailedError
//	507 write_failed                              *adapter.WriteFailedError
//	500 provider                                  *adapter.ProviderError
//	refused/reset connection, timeout, DNS, TLS   *adapter.UnavailableError
//	a 2xx body that fails to decode (cut)         *adapter.UnavailableError
//	the caller's context ended                    that context error (wrapped)
//
// The codes, statuses and kinds are wire.ErrorTable's; adapter/stream
// converts them, for this client and every other adapter.
//
// Streams end with exactly one terminal frame: the exit (exit-truth: a
// signal death is Code -1 and a "SIGKILL"-style name), adapter.ErrLost for
// a lost session, an error frame's kind (its code's, as in the table, but
// not_found, which inside a stream is never definitive and reads as
// unavailable), or *adapter.UnavailableError for a cut or silent
// connection. Streams are adapter/stream's (stream.New over a FrameReader).
//
// # Terminated versus signaled
//
// The contract wants adapter.ReasonTerminated for a command that ended
// after TerminateSession, Suspend or Destroy asked it to stop. runnerd's
// exit record carries "terminated": true exactly then (its shim knows a
// stop was asked before the exit, and the record is durable), and the
// Adapter maps it to ReasonTerminated with the record's Code and Signal: a
// command that trapped TERM and exited 7 is terminated with Code 7, one
// that was killed is Code -1 and the signal. A SIGTERM sent through
// Client.Signal is not a terminate: ReasonSignaled. The answer survives
// restarts of runnerd and of the control plane. The Adapter keeps no
// record of its own: with a runnerd that predates the field, such ends
// read as ReasonSignaled (or ReasonExited).
//
// # Incarnations
//
// Every handle-scoped call carries the handle's incarnation (see
// [WithIncarnation]); runnerd refuses it with not_found when the live
// sandbox of that name is another one, in the same step as the act, so a
// stale handle never acts on a newer sandbox of the same name (its Destroy
// is a no-op success). A runnerd that predates the check ignores it.
//
// # Many runners: the pool's naming rule
//
// [NewPool] drives several runnerd endpoints as one adapter. Each endpoint
// has a short name (1-20 of [a-z0-9], no '-'); a sandbox name carries its
// route as its first label: "<runner>-<rest>", e.g. "r1-agent-7f3a" lives
// on runner "r1". The whole name is the sandbox's name on that runner, so
// the runner's own registry stays the authority. [Adapter.NewName] mints such
// names (the seed's name: {Mod, :fun, args} hook); Create of a name whose
// prefix names no runner of the pool is *adapter.InvalidError, and Get of
// such a name is *adapter.InvalidError too (never not_found: the pool
// cannot ask the authority). A listing visits the runners in their given
// order; its page token carries the runner's index and that runner's own
// token, so a listing cut at any runner is an error, never a short set.
package client
