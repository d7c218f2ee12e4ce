package shim

import (
	"sync"

	"github.com/agentrunner/runner/seccomp"
)

// compiledFilter is the sandbox's seccomp filter (Docker's default
// profile, package seccomp), compiled once per shim process and encoded
// for the plan (seccomp.Filter.MarshalBinary): every helper this shim
// starts installs these bytes, checked, without compiling. A warm shim
// that may start a helper compiles it while it waits (warmMain), so no
// start pays for it; a cold shim compiles it at its one start, as the
// helper did before, minus the helper's own runtime having to do it.
// The error (an architecture the package does not handle) is kept too:
// every isolated start of this shim then fails.
var compiledFilter = sync.OnceValues(func() ([]byte, error) {
	f, err := seccomp.Default()
	if err != nil {
		return nil, err
	}
	return f.MarshalBinary()
})
