package daemon

// A full state disk: what runnerd does so that control operations still
// work when a sandbox (or anything else) has filled the state file system.
//
//   - Every journal holds a reserve that its Finish frees first (package
//     journal), so a session can always record its end; a shim asked to
//     terminate gives up, counted in the exit record, the output its
//     journal cannot take once the command has ended (package shim).
//   - The registry holds a reserve (registry.SetReserve) that the commits
//     which record an end or remove something release and retry once
//     when the file system refuses them; a destroy or delete, which free
//     space, set it aside again (replenishReserve).
//   - What still cannot be written is 507 write_failed with
//     retry_after_ms, promptly (errNoSpace), never a hang.

import (
	"context"
	"errors"
	"syscall"
	"time"

	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/shim"
	"github.com/agentrunner/runner/wire"
)

// DefaultDiskReserve is Config.DiskReserve when it is 0.
const DefaultDiskReserve = 8 << 20

// reserveFile is the registry's reserve under STATE.
const reserveFile = "registry.reserve"

// noSpaceRetry is the wait a write_failed answer for a full disk asks for:
// space comes back when something is deleted, not at a known time.
const noSpaceRetry = 5 * time.Second

// isNoSpace reports whether err is a file system out of blocks, inodes or
// quota.
func isNoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// errNoSpace is the answer for what could not be written because the
// file system is full: 507 write_failed, retry_after_ms set.
func errNoSpace(what string, err error) *apiError {
	ae := errWriteFailed("%s: %v", what, err)
	ae.retryAfterMS = noSpaceRetry.Milliseconds()
	return ae
}

// errRegistryWrite is the answer for a registry commit that failed: a full
// disk is write_failed (errNoSpace), anything else unavailable.
func errRegistryWrite(err error) *apiError {
	if isNoSpace(err) {
		return errNoSpace("write registry", err)
	}
	return errUnavailable("write registry: %v", err)
}

// refuseDiskBudget answers a disk budget (limits disk_bytes, disk_inodes)
// 501 not_supported: runnerd does not enforce one yet (it needs a file
// system per sandbox; this kernel has no project quotas), and a limit
// that is not enforced is never accepted nor reported.
func refuseDiskBudget(l *wire.Limits) error {
	if l != nil && (l.DiskBytes != 0 || l.DiskInodes != 0) {
		return errNotSupported("disk_bytes and disk_inodes are not enforced by this runnerd (a disk budget needs a file system per sandbox, not built yet; docs/operations.md, \"When the disk fills\")")
	}
	return nil
}

// execStorageCheck is how often an exec that has not ended asks its
// shim whether its output is waiting for space; execStuckStrikes checks
// in a row that say so end it (execStuck).
const (
	execStorageCheck = time.Second
	execStuckStrikes = 2
)

// execStuck asks the shim of an exec's session whether its journal is
// failing writes (write_error) and counts the answers in a row in
// *strikes. It returns the write error once execStuckStrikes answers
// said so, "" otherwise (also when the shim cannot be asked: the exec
// keeps waiting for its end as before). The exec then terminates the
// command and answers 507: its result could not be stored, and waiting
// for space would leave the caller without an answer for as long as the
// disk stays full.
func (s *server) execStuck(ctx context.Context, ss registry.Session, strikes *int) string {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c, err := shim.Dial(ctx, s.sessionDir(ss))
	if err != nil {
		return ""
	}
	defer c.Close()
	st, err := c.Status(ctx)
	if err != nil || st.WriteError == "" {
		*strikes = 0
		return ""
	}
	if *strikes++; *strikes < execStuckStrikes {
		return ""
	}
	return st.WriteError
}

// replenishReserve sets the registry's reserve aside again after
// something freed space (a destroy, a deleted session); a failure is only
// logged: the next release finds no reserve and says so.
func (s *server) replenishReserve() {
	if _, err := s.reg.ReplenishReserve(); err != nil {
		s.log.Warn("registry reserve not set aside", "err", err)
	}
}
