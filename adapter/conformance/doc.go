// Package conformance is the executable form of the adapter contract: an
// importable suite, shaped like testing/fstest.TestFS and nettest.TestConn,
// that one call from any module's tests runs against an adapter:
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, conformance.Harness{
//			New: func(t conformance.T) conformance.Subject {
//				a := myprovider.New(...)
//				t.Cleanup(func() { a.Close() })
//				return conformance.Subject{Adapter: a, Outage: ..., InterruptList: ...}
//			},
//			Fixtures: conformance.ShellFixtures(),
//		})
//	}
//
// Every subtest gets a fresh [Subject] from [Harness.New] (go-cloud
// drivertest style), runs under a timeout that fails it and cancels its
// context instead of hanging, and reports every misbehaviour it sees rather
// than only the first. Optional capabilities are checked both ways: an
// advertised capability must work (through a fixture where behaviour is
// only observable from inside the sandbox), and a capability that is not
// advertised must refuse with adapter.ErrNotSupported.
//
// # What it pins
//
// Create idempotency under concurrency and new incarnations after destroy;
// not_found versus transient (get of a destroyed name is not_found; no call
// during an induced outage is); destroy tolerance; full-view paged listing
// and the interrupted listing as an error; exec never panics and reports
// exit 3 on the blocking and the streaming path; exactly one terminal frame
// and nothing after it, contiguous offsets per stream; stdin totality (a
// cat ends on close and nothing else, command_exited after exit);
// caller-supplied session ids; detached sessions (drop, list, rejoin, real
// exit code); replay from byte zero and from a cursor, byte-exact, stdout
// and stderr apart; terminate_session's grace bounds and confirmed exit;
// suspend/resume keeping a file; allow: [] denying egress through a probe;
// public URLs; TTY sessions; checkpoints.
//
// # Hooks
//
// Subject.Outage and Subject.InterruptList induce the faults the
// absence-definitive and honest-listing subtests need. When a hook (or a
// fixture for an advertised capability) is missing, its subtest is skipped
// with a message that says the requirement went unchecked: a skip here is
// not a pass.
//
// # Checking the suite itself
//
// [Tests] exposes the subtests as a table and [T] is the part of
// *testing.T they use, so the suite's own tests run it with a recorder
// against deliberately broken adapters and prove each defect is caught by
// the subtest meant to catch it.
package conformance
