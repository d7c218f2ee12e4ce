package cgroup

import (
	"context"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Whose Root is it. Two runnerds started from the same login (one under
// sudo, one not) sit in the same cgroup and, with the default relative
// Root, name the same directory. The one that created it owns it; the
// other found it already there, so creating it (MkdirAll) proved nothing:
// an unprivileged runnerd then advertised limits, failed every sandbox on
// "mkdir ROOT/NAME: permission denied", and listed the root runnerd's
// live sandboxes as its own leftovers. So Root must also be owned by the
// calling process's effective uid and writable by it; otherwise it is
// another's, and the Manager refuses to touch it (foreign): every
// operation fails with the same error, Available first, and List never
// names what is under it.

// checkOwned returns nil when every existing directory of dirs is owned by
// the effective uid and writable by it, else an error wrapping
// ErrNotSupported that names the owner. A missing directory is not
// checked (creating it failed, and that error says why).
func checkOwned(dirs []string) error {
	euid := os.Geteuid()
	for _, d := range dirs {
		var st unix.Stat_t
		if err := unix.Stat(d, &st); errors.Is(err, unix.ENOENT) {
			continue
		} else if err != nil {
			return fmt.Errorf("stat cgroup root %s: %w: %w", d, err, ErrNotSupported)
		}
		if int(st.Uid) != euid {
			return fmt.Errorf("cgroup root %s belongs to uid %d, not to this process's uid %d (another runnerd's: give this one its own --cgroup-root, in a cgroup delegated to it): %w",
				d, st.Uid, euid, ErrNotSupported)
		}
		if err := unix.Faccessat(unix.AT_FDCWD, d, unix.W_OK|unix.X_OK, unix.AT_EACCESS); err != nil {
			return fmt.Errorf("cgroup root %s is not writable by uid %d: %w: %w", d, euid, err, ErrNotSupported)
		}
	}
	return nil
}

// foreign is the backend of a Manager whose Root is another's
// (checkOwned): every operation fails with err, so nothing under Root is
// created, adopted, listed or removed.
type foreign struct {
	err  error
	dirs []string
}

var _ backend = foreign{}

func (f foreign) available() error                                    { return f.err }
func (f foreign) ensure(string, Limits) error                         { return f.err }
func (f foreign) exists(string) (bool, error)                         { return false, f.err }
func (f foreign) usage(string) (Usage, error)                         { return Usage{}, f.err }
func (f foreign) sessionDirs(string, string) ([]string, error)        { return nil, f.err }
func (f foreign) removeSession(context.Context, string, string) error { return f.err }
func (f foreign) remove(context.Context, string) error                { return f.err }
func (f foreign) list() ([]string, error)                             { return nil, f.err }
func (f foreign) held(string) (held, error)                           { return held{}, f.err }
func (f foreign) rootDirs() []string                                  { return f.dirs }
