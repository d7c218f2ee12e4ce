package shim

import "github.com/agentrunner/runner/shim/sessiondir"

// Hooks are what the program that runs the supervisor adds to each
// session's life. The supervisor knows no provider: a provider's quirk
// (runner-shim's Sprites task hold, which keeps the sprite from pausing
// while a command runs) is a hook that program passes to Main. The zero
// Hooks adds nothing (runnerd's shims).
type Hooks struct {
	// Running, if set, is called once the command runs, with its spec,
	// before any output is read; the function it returns is called once,
	// right after the exit record is published. Neither may fail or hold
	// up the session: a hook reports its own trouble on stderr (the
	// session's shim.log) and keeps its goroutines to itself.
	Running func(spec sessiondir.Spec) (ended func())
}

// running calls h.Running, if set, and returns what to call once the exit
// record is published.
func (h Hooks) running(spec sessiondir.Spec) (ended func()) {
	if h.Running == nil {
		return func() {}
	}
	return h.Running(spec)
}
