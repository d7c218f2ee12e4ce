package shim

import (
	"sync"

	"github.com/agentrunner/runner/seccomp"
)

// filterFor returns the encoded seccomp filter (seccomp.Filter.MarshalBinary)
// an Isolate or Pod start's helper installs: the one the launcher compiled
// and put in the spec (launch.Pool does, once per runnerd), else this shim's
// own compile, once per process. The helper checks the bytes either way
// (loadSeccomp).
//
// Why not compile in every shim: the program is the same for every
// sandbox of a host, and a compile in a shim, 0.3 ms of CPU on the start's
// path, also leaves an idle shim about 0.35 MiB more private memory (its
// heap passes the first collection's trigger; measured on an isolated cold
// shim: 1.47 MiB private without, 1.81 with).
func filterFor(spec []byte) ([]byte, error) {
	if len(spec) > 0 {
		return spec, nil
	}
	return compiledFilter()
}

// compiledFilter is the shim's own compile of the sandbox's filter
// (Docker's default profile, package seccomp), for a spec that brought
// none (a launcher other than launch.Pool), once per shim process. The
// error (an architecture the package does not handle) is kept too: every
// isolated start of this shim then fails.
var compiledFilter = sync.OnceValues(func() ([]byte, error) {
	f, err := seccomp.Default()
	if err != nil {
		return nil, err
	}
	return f.MarshalBinary()
})
