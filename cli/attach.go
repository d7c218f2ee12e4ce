package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/wire"
)

func init() {
	commands = append(commands, &command{name: "attach", args: "NAME ID [--cursor N | --tail N | --since DURATION|TIME]", min: 2, max: 2,
		short: "attach this terminal to a session: see its output live, type into it",
		long: `A TTY session (spawn --tty) takes over this terminal: it is put in raw mode,
every key goes to the session, and the session follows this terminal's size.
Press Ctrl-] (the detach key) to detach: the session keeps running, and runner
prints how to reattach. When the command ends runner restores the terminal and
exits with the command's exit code.
A pipes session prints its stdout to stdout and its stderr to stderr; with -i
runner also sends its own stdin (and closes the session's stdin at EOF).
Ctrl-C there detaches.
Output is replayed from --cursor (default: the start, so a reattach shows what
happened while you were away), or with --tail N from the last N lines of each
stream as runner logs --tail counts them (a last line without a newline
counts; a terminal stream may start mid escape sequence), or with --since from a time: a Go duration
(10m: that long ago) or an RFC 3339 time; it may start up to 1 s of output
earlier, never later, and a terminal stream may start mid escape sequence.
If the connection to runnerd drops, runner
reconnects from where it was, byte-exactly, for up to 30 s; then it exits 255.
What is typed meanwhile is kept (1 MiB, then runner stops reading) and sent
once runnerd is back, in order and once.
Examples:
  runner spawn web-1 --tty --id sh -- bash && runner attach web-1 sh
  runner attach web-1 build --cursor 4096`,
		setup: attachCmd})
}

const reconnectFor = 30 * time.Second

// parseDetachKey accepts "ctrl-X" for X in a-z, [ \ ] ^ _ @, or "none".
func parseDetachKey(s string) (key byte, ok bool, err error) {
	s = strings.ToLower(strings.TrimSpace(s))
	if s == "none" || s == "" {
		return 0, false, nil
	}
	rest, found := strings.CutPrefix(s, "ctrl-")
	if !found {
		rest, found = strings.CutPrefix(s, "^")
	}
	if !found || len(rest) != 1 {
		return 0, false, fmt.Errorf("--detach-key %q: want ctrl-X (X a letter or one of @[\\]^_) or none", s)
	}
	c := rest[0]
	switch {
	case c >= 'a' && c <= 'z':
		return c - 'a' + 1, true, nil
	case c == '@' || c == '[' || c == '\\' || c == ']' || c == '^' || c == '_':
		return c & 0x1f, true, nil
	}
	return 0, false, fmt.Errorf("--detach-key %q: want ctrl-X (X a letter or one of @[\\]^_) or none", s)
}

// defaultDetachKey is Ctrl-], the detach key without --detach-key.
const defaultDetachKey = 0x1d

// detachKeyFlag is " --detach-key K" that gives a reattach the detach
// key this one had, "" for the default: the hint runner prints must not
// hand back a key the person chose not to use.
func detachKeyFlag(key byte, useKey bool) string {
	switch {
	case !useKey:
		return " --detach-key none"
	case key == defaultDetachKey:
		return ""
	case key >= 1 && key <= 26:
		return " --detach-key ctrl-" + string(rune('a'+key-1))
	}
	return " --detach-key 'ctrl-" + string(rune(key|0x40)) + "'" // quoted: [ ] \ are the shell's
}

// attachRun is one attach: the frame pump (with reconnection), the stdin
// pump and the resize follower. The frame pump's cursors are read only
// after it has ended.
type attachRun struct {
	c        *client.Client
	e        *env
	name, id string

	mu     sync.Mutex // guards fr and closed
	fr     *client.FrameReader
	closed bool

	ctx    context.Context // ends on stop: unblocks handshakes and backoff
	cancel context.CancelFunc

	cur   client.Cursors // owned by the frame pump: where to attach (again) from
	since time.Time      // --since: the first attach asks by time, reattaches by cursor
	tty   bool           // the session has stdout only
	// byTime (owned by the frame pump) says cur is not yet a cursor for
	// every stream: a --since attach that has not seen a byte of one.
	byTime bool
	// lostMsg, when set, is the notice when the connection is lost
	// (exec names its session).
	lostMsg string
}

// resumeFlags are the flags that attach again where a left off.
func (a *attachRun) resumeFlags() string {
	if a.byTime {
		return "--since " + a.since.UTC().Format(time.RFC3339Nano)
	}
	f := fmt.Sprintf("--cursor %d", a.cur.Stdout)
	if a.cur.Stderr > 0 {
		f += fmt.Sprintf(" --stderr-cursor %d", a.cur.Stderr)
	}
	return f
}

// parseSince reads --since: a Go duration before now, or an RFC 3339 time.
func parseSince(v string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(v); err == nil {
		if d < 0 {
			return time.Time{}, fmt.Errorf("--since %q: want a duration >= 0 or an RFC 3339 time", v)
		}
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("--since %q: want a duration (10m) or an RFC 3339 time", v)
	}
	return t, nil
}

// flagsSet returns the names of the flags given on the command line.
func flagsSet(fs *flag.FlagSet) map[string]bool {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}

// setReader installs fr as the current reader, or closes it if the attach
// is being stopped.
func (a *attachRun) setReader(fr *client.FrameReader) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		fr.Close()
		return false
	}
	a.fr = fr
	return true
}

// stop ends the frame pump (idempotent).
func (a *attachRun) stop() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closed = true
	a.cancel()
	if a.fr != nil {
		a.fr.Close()
	}
}

// pumpResult is how the frame pump ended: a terminal frame, or an error
// (a transport failure it could not recover, or a refused attach).
type pumpResult struct {
	frame *wire.Frame
	err   error
}

// pump copies frames to stdout/stderr until the terminal frame, and
// reconnects from the cursors after a transport failure.
func (a *attachRun) pump(out, errw io.Writer, notice func(string)) pumpResult {
	var lostAt time.Time
	backoff := 250 * time.Millisecond
	var prev *client.FrameReader // the last connection: reattach from its cursors
	for {
		var fr *client.FrameReader
		var err error
		switch {
		case prev != nil:
			fr, err = a.c.Reattach(a.ctx, a.name, a.id, prev)
		case !a.since.IsZero():
			fr, err = a.c.AttachSince(a.ctx, a.name, a.id, a.since)
		default:
			fr, err = a.c.Attach(a.ctx, a.name, a.id, a.cur)
		}
		if err == nil && a.setReader(fr) {
			if !lostAt.IsZero() {
				notice("reconnected")
			}
			err = a.read(fr, out, errw, &lostAt)
			fr.Close()
			a.cur = fr.Cursors() // read wrote out every frame it got (or the attach ends)
			prev = fr
			_, outKnown := fr.Start(wire.StreamStdout)
			_, errKnown := fr.Start(wire.StreamStderr)
			a.byTime = !outKnown || (!a.tty && !errKnown)
			if err == nil {
				return pumpResult{err: errStopped}
			}
			var tf *terminalFrame
			if errors.As(err, &tf) {
				return pumpResult{frame: &tf.f}
			}
		} else if err == nil {
			return pumpResult{err: errStopped}
		}
		if a.ctx.Err() != nil {
			return pumpResult{err: errStopped}
		}
		if !errors.Is(err, adapter.ErrUnavailable) {
			return pumpResult{err: err}
		}
		if lostAt.IsZero() {
			lostAt = time.Now()
			if a.lostMsg != "" {
				notice(a.lostMsg)
			} else {
				notice("connection to runnerd lost; reconnecting (the session keeps running)...")
			}
		}
		if reconnectGiveUp(lostAt) {
			return pumpResult{err: err}
		}
		select {
		case <-a.ctx.Done():
			return pumpResult{err: errStopped}
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 2*time.Second)
	}
}

var errStopped = errors.New("attach stopped")

type terminalFrame struct{ f wire.Frame }

func (t *terminalFrame) Error() string { return "terminal frame" }

// read reads one connection's frames. It returns *terminalFrame at the end,
// nil when stopped, or the transport error.
func (a *attachRun) read(fr *client.FrameReader, out, errw io.Writer, lostAt *time.Time) error {
	for {
		f, err := fr.Next()
		if err != nil {
			if a.ctx.Err() != nil {
				return nil
			}
			return err
		}
		*lostAt = time.Time{} // connected again: a later loss gets a fresh budget
		// FrameReader checks that data continues exactly at the cursors
		// it was opened with (a gap is *adapter.UnavailableError from
		// Next) and keeps them; pump takes them from it.
		switch {
		case f.Kind == wire.FrameData && f.Stream == wire.StreamStdout:
			if _, err := out.Write(f.Payload); err != nil {
				return writeErr("stdout", err)
			}
		case f.Kind == wire.FrameData && f.Stream == wire.StreamStderr:
			if _, err := errw.Write(f.Payload); err != nil {
				return writeErr("stderr", err)
			}
		case f.Kind.Terminal():
			return &terminalFrame{f: f}
		}
	}
}

// errBrokenPipe is a write to runner's stdout or stderr that nobody
// reads any more (`runner exec box -- yes | head -1`): runner's reader
// went away, as a shell pipeline's reader does.
var errBrokenPipe = errors.New("broken pipe")

// writeErr is the error of a failed write of stream's output:
// errBrokenPipe for EPIPE, else an io failure (exit 246).
func writeErr(stream string, err error) error {
	if errors.Is(err, syscall.EPIPE) {
		return fmt.Errorf("write %s: %w", stream, errBrokenPipe)
	}
	return &exitError{code: exitOther, kind: "io", msg: fmt.Sprintf("runner: attach: write %s: %v", stream, err)}
}

func attachCmd(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
	cursor := fs.Int64("cursor", 0, "stdout byte offset to replay from")
	stderrCursor := fs.Int64("stderr-cursor", 0, "stderr byte offset to replay from (pipes sessions)")
	detach := fs.String("detach-key", "ctrl-]", `key that detaches, leaving the session running: ctrl-X, or "none"`)
	sendStdin := fs.Bool("i", false, "pipes session: send this stdin to the session, close its stdin at EOF")
	tail := fs.Int64("tail", -1, "start at the last N lines of each stream instead of at a cursor")
	sinceFlag := fs.String("since", "", "start at output written since a time: a duration ago (10m) or an RFC 3339 time")
	return func(ctx context.Context, e *env, pos, _ []string) error {
		name, id := pos[0], pos[1]
		what := "attach " + name + " " + id
		key, useKey, err := parseDetachKey(*detach)
		if err != nil {
			return usagef("attach", "%v", err)
		}
		var since time.Time
		if set := flagsSet(fs); set["since"] {
			if set["cursor"] || set["stderr-cursor"] || set["tail"] {
				return usagef("attach", "--since and --cursor/--stderr-cursor/--tail exclude each other")
			}
			if since, err = parseSince(*sinceFlag, time.Now()); err != nil {
				return usagef("attach", "%v", err)
			}
		}
		if *cursor < 0 || *stderrCursor < 0 {
			return usagef("attach", "cursors are byte offsets >= 0")
		}
		if *tail < -1 {
			return usagef("attach", "--tail %d: want a line count >= 0", *tail)
		}
		c, err := e.client()
		if err != nil {
			return err
		}
		sctx, scancel := e.callCtx(ctx)
		s, err := c.Session(sctx, name, id)
		scancel()
		if err != nil {
			return fail(what, err)
		}
		if s.TTY && *stderrCursor != 0 {
			return usagef("attach", "a TTY session has only stdout: drop --stderr-cursor")
		}
		if *tail >= 0 {
			if *cursor != 0 || *stderrCursor != 0 {
				return usagef("attach", "--tail and --cursor/--stderr-cursor exclude each other")
			}
			// Lines, as runner logs --tail counts them (tailLines).
			if *cursor, err = tailLines(ctx, e, c, name, id, "stdout", lengthOf(s, "stdout"), *tail); err != nil {
				return fail(what, err)
			}
			if !s.TTY {
				if *stderrCursor, err = tailLines(ctx, e, c, name, id, "stderr", lengthOf(s, "stderr"), *tail); err != nil {
					return fail(what, err)
				}
			}
		}
		r, err := e.follow(ctx, c, followOpts{what: what, name: name, id: id, s: s,
			cur: client.Cursors{Stdout: *cursor, Stderr: *stderrCursor}, since: since,
			key: key, useKey: useKey, stdin: s.TTY || *sendStdin})
		if err != nil {
			return err
		}
		return e.endOf(ctx, c, what, name, r.frame)
	}
}
