package sessions

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/agentrunner/runner/shim/launch"
	"github.com/agentrunner/runner/shim/sessiondir"
	"golang.org/x/sys/unix"
)

// verifyNetNS checks that the command of a session that was to start in
// the namespace at path runs there. A command that already ended cannot
// be checked and is not an escape: the shim forked it from a thread it
// had proved to be inside (shim.startIn), so its spawn is answered with
// the session, whose exit follows. "Ended" is what the kernel says of the
// pid (no such file: reaped, or a zombie whose namespaces are released;
// no such process: exiting) or, when the check fails or finds the pid
// outside (a pid the kernel already gave to another process), what the
// session's shim says of its command (exited). Only a command that the
// shim says runs and that is not in the namespace is an escape.
func (s *Manager) verifyNetNS(ctx context.Context, pid int, path, sessionDir string) error {
	ok, err := s.cfg.NetNSCheck(pid, path)
	switch {
	case err == nil && ok:
		return nil
	case err != nil && (errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ESRCH)):
		return nil
	}
	if commandEnded(ctx, sessionDir) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("verify network namespace of pid %d: %w", pid, err)
	}
	return fmt.Errorf("pid %d is not in the sandbox's network namespace", pid)
}

// commandEnded reports whether the shim of the session at dir says its
// command has exited; false when it cannot say.
func commandEnded(ctx context.Context, dir string) bool {
	c, ctx, cancel, err := launch.DialFor(context.WithoutCancel(ctx), dir, launch.Check)
	defer cancel()
	if err != nil {
		st, rerr := sessiondir.ReadStatus(dir)
		return rerr == nil && st.State == sessiondir.StateExited
	}
	defer c.Close()
	st, err := c.Status(ctx)
	return err == nil && st.State == sessiondir.StateExited
}

// killUnverified stops a session whose command could not be shown to run
// in its sandbox's namespace, and waits for its exit record.
func (s *Manager) killUnverified(ctx context.Context, dir string) error {
	c, ctx, cancel, err := launch.DialFor(context.WithoutCancel(ctx), dir, launch.Kill)
	defer cancel()
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Terminate(ctx, time.Millisecond)
	return err
}
