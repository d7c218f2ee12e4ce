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
//     sandbox. A 409 on create additionally matches [ErrNameTaken], so the
//     layer above can adopt the existing sandbox (GET it by name).
//   - The API key travels only in the Authorization header, never across a
//     redirect (none is followed), and never in URLs, errors, logs or any
//     fmt / JSON / slog rendering of this package's values ([Secret]
//     redacts itself).
//   - A listing is honest: a page cut short, unparsable or without its
//     items is an error, never a short page.
//
// # What the toolbox does to bytes
//
// Session command output is not a byte stream. The daemon runs each
// command with stdout and stderr piped through a line-reading shell loop
// that prefixes every line with a stream marker (01 01 01 for stdout,
// 02 02 02 for stderr) in one log file. So NUL bytes are dropped, a final
// newline is added to an unterminated last line, the markers may also
// occur inside a payload, and invalid UTF-8 comes back replaced. Input is
// a JSON string with "\n" appended when missing, also echoed into the log
// as stdout; there is no way to close a command's stdin or to kill one
// command. A caller that needs bytes must encode them (runner-shim's
// text-safe mode) and take exit codes from its own protocol. See
// [Toolbox.Logs] and the tests named TestQuirk*.
//
// This package is the client only: the contract policy (adopt on 409,
// what is advertised) lives above it.
package daytona
