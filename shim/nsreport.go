package shim

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/agentrunner/runner/shim/internal/proto"
)

// The helper's report (nsexec.go, "Protocol"), read the same way for a
// helper forked for the start and one started ahead.

// awaitReport reads the report of a helper that was sent all it needs
// (sendErr: how the sending failed, if it did), within conn's deadline,
// for both kinds of helper (forked for the start, or started ahead). It
// returns nil once the helper said "exec" and its socket closed with the
// execve, else the start error: the helper's own report first, then the
// read's or the send's failure. silent is true when the helper closed
// without a word before the deadline: it died before doing anything of
// the start ("exec" comes before the execve), so the command never ran.
func awaitReport(conn *net.UnixConn, sendErr error) (silent bool, err error) {
	conn.CloseWrite()
	rep, rerr := io.ReadAll(io.LimitReader(conn, 4096))
	switch {
	case errors.Is(rerr, os.ErrDeadlineExceeded):
		return false, fmt.Errorf("nsexec: the helper did not report within %v: %w", nsexecTimeout, syscall.ETIMEDOUT)
	case len(rep) == 0:
		// Closed without a word (EOF, or ECONNRESET: it died with our
		// bytes unread). Its queued bytes would have been read before
		// the reset.
		return true, parseNsexecReport("")
	}
	// A helper whose step failed reported it and exited with our bytes
	// unread, which resets the connection after its report: the report
	// is the answer.
	if perr := parseNsexecReport(string(rep)); perr != nil {
		return false, perr
	}
	if rerr != nil {
		return false, fmt.Errorf("nsexec: read the helper's report: %w", rerr)
	}
	if sendErr != nil {
		return false, fmt.Errorf("nsexec: send parameters to the helper: %w", sendErr)
	}
	return false, nil
}

// parseNsexecReport turns the helper's report into nil (the execve
// succeeded) or the start error.
func parseNsexecReport(rep string) error {
	rep = takeHelperSpans(rep) // trace.go
	rest, execd := strings.CutPrefix(rep, "exec\n")
	if line, ok := strings.CutPrefix(rest, "error "); ok {
		line = strings.TrimSuffix(line, "\n")
		num, step, _ := strings.Cut(line, " ")
		phase, step, _ := strings.Cut(step, " ")
		n, _ := strconv.Atoi(num)
		err := fmt.Errorf("%s: %w", step, syscall.Errno(n))
		if n == 0 {
			err = errors.New(step)
		}
		if phase == proto.PhaseExec {
			return &proto.CommandError{Err: err}
		}
		return err
	}
	if execd && rest == "" {
		return nil
	}
	return fmt.Errorf("nsexec: the helper ended before executing the command (report %q)", rep)
}
