package launch

import (
	"fmt"
	"sync"

	"github.com/agentrunner/runner/seccomp"
	"github.com/agentrunner/runner/shim/sessiondir"
)

// withFilter returns spec with Spec.Seccomp set for an Isolate or Pod
// spec: the sandbox's filter (Docker's default profile, package seccomp),
// compiled once per process (runnerd's) and handed to every shim, so that
// no shim compiles it on a start's path, nor keeps the memory a compile
// leaves behind. Whatever program the caller's spec carried is replaced:
// the filter is this runnerd's (a spec kept from an older one must not
// bring an older, weaker filter back). The shim's helper checks the bytes
// before it installs them. A compile error (an architecture seccomp does
// not handle) fails the start, as the shim's own compile would. Any other
// spec is returned without a program.
func withFilter(spec sessiondir.Spec) (sessiondir.Spec, error) {
	if !(spec.Isolate || spec.Pod != nil) {
		spec.Seccomp = nil
		return spec, nil
	}
	prog, err := compiledFilter()
	if err != nil {
		return spec, fmt.Errorf("start shim: build the seccomp filter: %w", err)
	}
	spec.Seccomp = prog
	return spec, nil
}

// compiledFilter is the process's one compile (the bytes are shared by
// every spec; nothing writes to them).
var compiledFilter = sync.OnceValues(func() ([]byte, error) {
	f, err := seccomp.Default()
	if err != nil {
		return nil, err
	}
	return f.MarshalBinary()
})
