// Package daytona is the Daytona-specific layer beneath the shim
// transport: a client for Daytona's control-plane REST API (sandboxes:
// create by name, get by id or name, cursor-paged list, asynchronous
// delete, stop and start) and for the toolbox, the daemon inside every
// sandbox, reached through Daytona's toolbox proxy (one-shot execute,
// sessions with asynchronous commands, their logs and input, file upload
// and download).
//
// It is written from the public sources: daytonaio/daytona apps/api (the
// sandbox controller and DTOs: CreateSandbox, Sandbox, ListSandboxesQuery,
// ToolboxProxyUrl, the NestJS error body {statusCode, message, error}),
// apps/daemon (pkg/toolbox/process/execute.go, pkg/session: create,
// execute, log, input; the common-go error body) and the SDKs
// (libs/sdk-typescript: Bearer auth, the toolbox base
// <toolboxProxyUrl>/<sandboxId>, polling for "started").
//
// # Invariants
//
//   - Every error this package returns carries, after errors.Is / errors.As,
//     exactly one kind of the adapter taxonomy (see errors.go), or a context
//     error when the caller's context ended first. [adapter.ErrNotFound] is
//     given only for a 404 with the API's own error body on GET of a
//     sandbox. A toolbox answer is judged by the status the daemon meant
//     ([Error.OwnStatus]: a wrapped 500's common-go prefix, gin's
//     empty-bodied 400 and 404), never as a sandbox's absence. A 409 on create additionally matches [ErrNameTaken], so the
//     layer above can adopt the existing sandbox (GET it by name).
//   - The API key travels only in the Authorization header, never across a
//     redirect (none is followed), and never in URLs, errors, logs or any
//     fmt / JSON / slog rendering of this package's values ([Secret]
//     redacts itself).
//   - A listing is honest: a page cut short, unparsable or without its
//     items is an error, never a short page.
//
// # What the toolbox does to commands and bytes
//
// (As daemon v0.190.0 does, checked against one built from that tag.) A
// session is a shell (zsh or bash, as /etc/shells lists them) reading
// commands on its stdin; each command is sourced in that shell itself, so
// its cd and variables carry over and its `exit` ends the session (that
// command never gets an exit code, and the next exec fails). Its output
// is not a byte stream: stdout and stderr pass through a line-reading
// shell loop that prefixes every line with a stream marker (01 01 01 for
// stdout, 02 02 02 for stderr) in one log file. So NUL bytes are dropped,
// a final newline is added to an unterminated last line, and the markers
// may also occur inside a payload. The plain-text log keeps invalid UTF-8
// as raw bytes; only JSON answers (a synchronous exec's output, a log
// asked for with an SDK version from 0.167.0) carry U+FFFD. Input is a
// JSON string with "\n" appended when missing, also echoed into the log
// as stdout, and its write blocks with no deadline until the command
// reads; there is no way to close a command's stdin or to kill one
// command, only to delete its session (SIGTERM, a 100 ms check, SIGKILL
// after 5 s). The exit code is appended to its file with `>>`, so a read
// of a command's record can meet it empty and answer 500 (Command reads
// it again). /process/execute runs its command through the shell. A
// caller that needs bytes must encode them (runner-shim's text-safe mode)
// and take exit codes from its own protocol. See [Toolbox.Logs] and the
// tests named TestQuirk*.
//
// # The contract adapter
//
// [Adapter] (adapter.go) is the contract over this client: sandboxes by
// the caller's name (409 on create adopts the existing one; Get's
// not_found only from the definitive 404), suspend as stop and start
// (the disk is kept), and sessions through runner-shim driven by
// adapter/guest in its text-safe mode only. Its executor (exec.go) runs
// each runner-shim call in a toolbox session it holds for the call (idle
// sessions are pooled, so the session DELETE's 100 ms is off the call's
// path): the argv, quoted here, in an uploaded script run by a child
// shell (no caller text crosses a command line or the session's input),
// stdin in an uploaded file, stderr discarded, and a trailer line with a
// per-call nonce and the exit status; it polls the command's log and
// takes the status only from the trailer, never from the toolbox's
// exitCode, and gives a call with no trailer up after its lifetime as
// unavailable wrapping guest.ErrNoStatus. Every byte read back is base64 or JSON, which
// the toolbox's mangling leaves intact. docs/providers/daytona.md has
// the mapping of every call and the error map.
package daytona
