package daemon

// Descriptor budget: runnerd raises its soft RLIMIT_NOFILE to the hard
// limit at start (raiseNoFile), and refuses a request that holds
// descriptors for its whole life (an attach, a stream) with 503
// unavailable, before any upgrade or byte of the answer, while fewer than
// a reserve of descriptors is free (refuseWithoutDescriptors). So the
// descriptors a busy host has left go to the calls that end (spawn,
// terminate, destroy, the registry) instead of to an upgraded WebSocket
// that then cannot open its journal.

import (
	"errors"
	"fmt"
	"net/http"
	"os"

	"github.com/agentrunner/runner/daemon/apierr"
	"golang.org/x/sys/unix"
)

// minDescriptorReserve is the least number of descriptors kept free for
// calls that end; the reserve is a sixteenth of the limit when that is
// more. An attach holds about five (its connection, a reader per stream,
// a shim connection), so the reserve also covers the attaches admitted
// at the same instant.
const minDescriptorReserve = 64

// raiseNoFile raises the soft RLIMIT_NOFILE to the hard limit and returns
// the limits it leaves: a host with thousands of sessions holds a
// descriptor per connection, journal reader and shim socket. (The Go
// runtime does the same at start since Go 1.19; doing it here keeps the
// guarantee when runnerd is a library of another program, and reports
// it.) Children started with os/exec get the original soft limit back.
func raiseNoFile() (unix.Rlimit, error) {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return lim, fmt.Errorf("read RLIMIT_NOFILE: %w", err)
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
			return lim, fmt.Errorf("raise RLIMIT_NOFILE to %d: %w", lim.Max, err)
		}
	}
	return lim, nil
}

// errNoDescriptors is what descriptorsLeft returns when the reserve is
// not free.
var errNoDescriptors = errors.New("file descriptors nearly exhausted")

// descriptorsLeft returns nil while at least the reserve of descriptors
// is free under the soft RLIMIT_NOFILE, errNoDescriptors (wrapped with the
// numbers) otherwise. It costs two system calls: getrlimit, and a stat of
// /proc/self/fd, whose size is the number of open descriptors (Linux 6.2
// and later; older kernels report 0 and it counts the directory instead).
func descriptorsLeft() error {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil || lim.Cur == unix.RLIM_INFINITY {
		return nil // no number to hold the count to
	}
	open, err := openDescriptors()
	if err != nil {
		return nil // unknown: do not refuse on a guess
	}
	reserve := max(uint64(minDescriptorReserve), lim.Cur/16)
	if open+reserve > lim.Cur {
		return fmt.Errorf("%w: %d of %d open, %d kept for other calls", errNoDescriptors, open, lim.Cur, reserve)
	}
	return nil
}

// openDescriptors is the number of descriptors this process has open.
func openDescriptors() (uint64, error) {
	fi, err := os.Stat("/proc/self/fd")
	if err != nil {
		return 0, err
	}
	if n := fi.Size(); n > 0 {
		return uint64(n), nil
	}
	f, err := os.Open("/proc/self/fd")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	return uint64(len(names)), err
}

// refuseWithoutDescriptors answers 503 unavailable and reports true when
// descriptorsLeft refuses: called first by the handlers of requests that
// hold descriptors for their life (attach, stream), before any upgrade.
func (s *server) refuseWithoutDescriptors(w http.ResponseWriter, r *http.Request) bool {
	err := descriptorsLeft()
	if err == nil {
		return false
	}
	s.writeError(w, r, apierr.Unavailable("%v; retry later", err))
	return true
}
