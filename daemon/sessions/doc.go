// Package sessions is runnerd's sessions manager: it owns a session from
// its spawn to its deletion. Spawn and exec (spawn.go, exec.go), the
// journals and their readers (journals.go), stdin gates and control
// (stdingate.go, sessioncontrol.go), terminate and delete (stopping.go),
// the per-sandbox bounds and the collector (sessions_cap.go, journal
// budgets in journalcap.go), listings (sessionlist.go), session
// archives that move a sandbox's ended sessions (archive.go), the records'
// repair from their shims (sessionstate.go, commits.go), exit recording
// (exitwatch.go), what runnerd
// repairs at start and the retention janitor (recovery.go), and the shim
// gateway (gateway.go): one way to start a shim (Config.Pool) and one way
// to reach it (launch.DialFor with a launch.Budget).
//
// Invariants:
//
//   - A session's lifetime never depends on runnerd: every command runs
//     under its own detached shim; nothing here kills a shim when runnerd
//     stops.
//   - Output has one path: readers read the session journal at each
//     client's own pace, never holding more than one bounded buffer each.
//   - A session's record may trail its shim (a commit made after the
//     answer, deferredCommits, or a crash). Reads never write: the
//     manager records each exit once (an exit watch per session whose
//     shim may run, exitwatch.go, started at spawn and at adoption by
//     Reconcile); a reader answers from the shim's own files when the
//     record lags (Status). The manager's own flows (terminate, delete,
//     control, the janitor, recovery) bring a record up to date first
//     (Refresh).
//   - A spawn holds its sandbox's lock (sandboxes.Manager.Locks) from
//     before its leaf cgroup is made to after its record is committed, so
//     it never races a destroy, a suspend or the leaf sweep.
//   - The import arrow runs sessions -> sandboxes -> registry: the
//     sandboxes manager reaches sessions only through sandboxes.Sessions,
//     which Manager implements.
//
// Methods take a context and typed arguments and return typed results
// and *apierr.Error for what the contract names; none writes an HTTP
// response (the HTTP face, package daemon, does).
package sessions
