package wire

// Exit statuses of the two command-line tools. They live here, beside the
// error table that assigns them, so that an adapter driving runner-shim
// inside a hosted sandbox (or a script driving runner) can name them
// without importing the tools' packages or their storage dependencies.

// Exit statuses of runner, the CLI, when it fails (exec and attach
// otherwise exit with the command's own status). ErrorTable assigns the
// per-kind ones.
const (
	RunnerExitOK    = 0
	RunnerExitUsage = 2 // bad flags or arguments
	// RunnerExitNotExecutable: exec or spawn named a command that exists
	// but cannot be run (permission, not an executable format), as sh,
	// docker exec and kubectl exec exit (Error.ExecError
	// ExecErrorNotExecutable).
	RunnerExitNotExecutable = 126
	// RunnerExitCommandNotFound: exec or spawn named a command that does
	// not exist in the sandbox, as sh exits (Error.ExecError
	// ExecErrorNotFound).
	RunnerExitCommandNotFound = 127
	RunnerExitInterrupted     = 130 // Ctrl-C: runner stopped waiting; the command may still run
	RunnerExitDetached        = 245 // attach: detached on purpose; the session still runs
	// RunnerExitOther is provider, restore_failed and write_failed.
	RunnerExitOther         = 246
	RunnerExitRateLimited   = 247
	RunnerExitTruncated     = 248
	RunnerExitCommandExited = 249
	RunnerExitNotSupported  = 250
	RunnerExitDenied        = 251
	RunnerExitInvalid       = 252
	RunnerExitNotFound      = 253
	RunnerExitLost          = 254 // the session ended without an exit record
	RunnerExitUnavailable   = 255 // runnerd unreachable or the connection was cut: outcome unknown
)

// Exit statuses of runner-shim (every subcommand but attach --text, which
// exits with the command's own status). ErrorTable assigns the per-kind
// ones; one status per kind a driver acts on differently, so an adapter
// that cannot read runner-shim's --json answer still classifies its end.
const (
	ShimExitOK      = 0
	ShimExitFailure = 1 // provider, write_failed and any failure without a status of its own
	ShimExitUsage   = 2
	// ShimExitCommandExited: a write, close-stdin, signal or resize reached
	// a command that has ended.
	ShimExitCommandExited = 3
	// ShimExitLost: the session's shim is gone without an exit record.
	ShimExitLost = 4
	// ShimExitNotFound: no such session (definitive: the shim's root is
	// the registry of its sessions).
	ShimExitNotFound = 5
	// ShimExitInvalid: a malformed request, or a cursor beyond the end.
	ShimExitInvalid = 6
	// ShimExitConflict: spawn --id of an existing session with another
	// request (code invalid, detail DetailConflict).
	ShimExitConflict = 7
	// ShimExitUnavailable: transient; the shim could not be reached or
	// the start could not be set up. Retry idempotent calls.
	ShimExitUnavailable = 8
	// ShimExitTruncated: a cursor behind the retained output.
	ShimExitTruncated = 9
	// ShimExitExecNotExecutable: spawn's program (or its working
	// directory) exists but cannot be executed (code invalid), as a shell
	// says it.
	ShimExitExecNotExecutable = 126
	// ShimExitExecNotFound: spawn's program (or its working directory)
	// does not exist (code invalid), as a shell says it.
	ShimExitExecNotFound = 127
)

// ShimDetailLeaseEnded starts the detail of the unavailable error frame
// that ends a bounded attach (runner-shim attach --lease or --max-bytes):
// "lease ended: stdout=N stderr=M", the cursors to attach again from. It
// is an honest transient end for any consumer; a driver that knows it
// reattaches at once.
const ShimDetailLeaseEnded = "lease ended"

// Exit statuses of runner-shim attach --text for ends that are not the
// command's own exit (which it passes through, 128+N for signal N). They
// agree with runner's: a lost session is RunnerExitLost in both tools, and
// a stream that ended with an error frame (no exit code is known) is
// RunnerExitUnavailable's "outcome unknown". (Before, runner-shim had
// them the other way round: 255 lost, 254 error.)
const (
	ShimTextExitError = RunnerExitUnavailable // 255: the stream ended with an error frame
	ShimTextExitLost  = RunnerExitLost        // 254: the session was lost: no exit code exists
)
