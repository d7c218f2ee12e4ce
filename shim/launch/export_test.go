package launch

// What the external tests (package launch_test, which use the shim test
// helpers in shim/internal/shimtest, and those import launch) reach
// inside the pool and the readiness protocol.

// FirstIdleStage is the staging directory of the oldest idle warm shim.
func FirstIdleStage(p *Pool) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.idle[0].stage
}

// Take takes an idle warm shim out of p (nil if none).
func Take(p *Pool) *WarmShim { return p.take() }

// WarmShim is a warm shim taken out of its pool.
type WarmShim = warmShim

// Give hands dir and a raw spec to w.
func Give(w *WarmShim, dir string, spec []byte) bool { return w.give(dir, spec) }

// PID is w's process id.
func PID(w *WarmShim) int { return w.pid }

// PreparedWith is a prepared start on w.
func PreparedWith(w *WarmShim) *Prepared { return &Prepared{w: w} }

// PreparedPID is the pid of the warm shim pr holds.
func PreparedPID(pr *Prepared) int { return pr.w.pid }

// Detacher is the function that finds setsid --fork.
var Detacher = &detacher

var (
	ShimEnv    = shimEnv
	ParseReady = parseReady
)
