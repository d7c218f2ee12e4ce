package conformance

// This file holds the suite's index: every subtest's name and function,
// in the order Run runs them. The checks live in tests_*.go, one file per
// area of the adapter contract.

// Tests returns the suite's subtests, in order. [Run] runs them all; a
// caller with its own T (a recorder) can run them one by one.
func Tests() []Test {
	return []Test{
		{"Capabilities/Known", testCapabilitiesKnown},
		{"Create/Idempotent", testCreateIdempotent},
		{"Create/NewIncarnation", testCreateNewIncarnation},
		{"Get/NotFoundAfterDestroy", testGetNotFound},
		{"Get/OutageIsNeverNotFound", testOutage},
		{"Destroy/AbsentIsSuccess", testDestroyAbsent},
		{"List/Paged", testListPaged},
		{"List/InterruptedIsAnError", testListInterrupted},
		{"Exec/OK", testExecOK},
		{"Exec/ExitCode", testExecExitCode},
		{"Exec/Stderr", testExecStderr},
		{"Exec/NeverPanics", testExecNeverPanics},
		{"Spawn/ExitCode", testSpawnExitCode},
		{"Spawn/OneTerminalFrame", testOneTerminalFrame},
		{"Spawn/Stderr", testSpawnStderr},
		{"Spawn/SessionIDIdempotent", testSpawnSessionID},
		{"Stdin/Total", testStdinTotal},
		{"Sessions/Detached", testDetached},
		{"Capability/attach", testAttach},
		{"Attach/ReplayCursor", testAttachCursors},
		{"Capability/terminate_session", testTerminate},
		{"Capability/suspend", testSuspend},
		{"Capability/network_policy", testNetworkPolicy},
		{"Capability/public_url", testPublicURL},
		{"Capability/tty", testTTY},
		{"Capability/checkpoint", testCheckpoint},
		{"Capability/fork", testFork}, // tests_fork.go
	}
}

// skipHook skips loudly when the adapter did not supply a fault hook.
func skipHook(t T, hook string) {
	t.Helper()
	t.Skipf("SKIPPED, NOT VERIFIED: the adapter's harness supplies no %s hook, so this requirement is unchecked for it", hook)
}
