// Package sessiondir reads a session directory without its shim: what
// runnerd, runner-shim's reading commands (attach, status, list) and the
// tests need once a shim made the directory, or after it is gone.
//
// It holds the directory's layout (spec.json, started.json, ctl.sock,
// shim.pid, shim.log, journal/), the Spec a session runs and its rules
// (Validate, ValidID, the user and cgroup checks), Status and ReadStatus,
// the exit record as the contract's (WireExit, FinalExit, FinishLost), the
// frame stream of docs/frames.md (Attach, EmitFrames, AttachText), Info,
// and the errors every side of the shim shares (ErrExited, ErrLost,
// ErrNoSession, ...).
//
// Invariants:
//
//   - Read-only toward a live session: nothing here opens the journal's
//     index.db while its writer (the shim) lives, or talks to the shim;
//     readers read the segment files. The one write, FinishLost, records
//     a session whose shim is gone without an exit record as lost, and
//     only once the journal's writer lock is free.
//   - Exit truth: a session reads "exited" only with the exit record,
//     "running" while the journal's writer lock is held, "lost" otherwise:
//     never exit 0 for an end nobody recorded.
//   - It imports neither the supervisor (package shim) nor the launcher
//     (shim/launch); both import it (deps_test.go holds the direction).
package sessiondir
