package sessions

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
	"time"

	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/shim/launch"
)

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
func (s *Manager) execStuck(ctx context.Context, ss registry.Session, strikes *int) string {
	c, ctx, cancel, err := launch.DialFor(ctx, s.Dir(ss), launch.Query)
	defer cancel()
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
