package cli

// runner logs: replay a session's journal, both streams by default
// (through the attach stream, which interleaves them as journaled) or one
// (through the plain stream endpoint), from a byte cursor, the last N
// lines or a time, and follow it with -f.

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"syscall"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/wire"
)

func init() {
	commands = append(commands, &command{name: "logs", args: "NAME ID [--stream both|stdout|stderr] [--cursor N | --tail N | --since DURATION|TIME] [-t] [-f]", min: 2, max: 2,
		short: "print a session's output (stdout and stderr); -f follows until it ends",
		long: `Output is replayed byte-exactly from the journal, live or long after the command
ended: stdout to stdout and stderr to stderr. Both streams by default,
interleaved as runnerd journaled them (see below); --stream stdout or stderr
prints that one stream alone, on stdout.
Order: each stream is in its own order, byte-exactly. Across the two, live
output (-f) interleaves as it is journaled, which is nearly always the order it
was written but not promised (the command writes two pipes; nothing records
which write came first), and a replay of output already journaled gives each
stream in chunks. A session started with both on one pipe (runner exec on a
terminal or under 2>&1) has one stream in the order it was written.
A TTY session has only stdout.
--tail N starts at the last N lines of each stream (a last line without a
newline counts). --cursor N (and --stderr-cursor N with both streams) starts at
a byte offset: the number of bytes you already have. --since starts at output
written since a time: a Go duration (10m: that long ago) or an RFC 3339 time;
it may start up to 1 s of output earlier, never later (a terminal stream may
start mid escape sequence).
--timestamps (-t) prefixes each line with a time runnerd's journal recorded:
that of the journal's mark at or before the line's first byte (of the first
byte printed, for a line entered in its middle), RFC 3339 in UTC. The line was
written at or after that time and less than 1 s (the mark granularity) after
it. A line before the journal's first mark gets "-" and a note on stderr.
Without -f runner prints what exists now and exits 0. With -f it prints until
the session ends. A session that ended without an exit record (lost) exits 254;
a cut connection exits 255 and says the cursor to resume from.`,
		setup: logsCmd})
}

// logsFlags are runner logs' flags.
type logsFlags struct {
	stream, since              *string
	cursor, stderrCursor, tail *int64
	follow, timestamps         *bool
}

func registerLogsFlags(fs *flag.FlagSet) logsFlags {
	f := logsFlags{
		stream:       fs.String("stream", "both", "both, stdout or stderr"),
		cursor:       fs.Int64("cursor", 0, "byte offset to start from (stdout's with both streams)"),
		stderrCursor: fs.Int64("stderr-cursor", 0, "stderr's byte offset to start from, with both streams"),
		tail:         fs.Int64("tail", -1, "start at the last N lines of each stream"),
		follow:       fs.Bool("f", false, "follow: keep printing until the session ends"),
		since:        fs.String("since", "", "start at output written since a time: a duration ago (10m) or an RFC 3339 time"),
		timestamps:   fs.Bool("timestamps", false, "prefix each line with the time the journal recorded for it (to 1 s)"),
	}
	fs.BoolVar(f.follow, "follow", false, "same as -f")
	fs.BoolVar(f.timestamps, "t", false, "same as --timestamps")
	return f
}

// check refuses flags that exclude each other or are out of range (set
// names those on the command line) and returns --since as a time, zero
// without it.
func (f logsFlags) check(set map[string]bool) (time.Time, error) {
	var since time.Time
	if set["since"] {
		if set["cursor"] || set["stderr-cursor"] || set["tail"] {
			return since, usagef("logs", "--since and --cursor/--stderr-cursor/--tail exclude each other")
		}
		var err error
		if since, err = parseSince(*f.since, time.Now()); err != nil {
			return since, usagef("logs", "%v", err)
		}
	}
	switch *f.stream {
	case "both", "stdout", "stderr":
	default:
		return since, usagef("logs", "--stream %q: want both, stdout or stderr", *f.stream)
	}
	if *f.cursor < 0 || *f.stderrCursor < 0 {
		return since, usagef("logs", "cursors are byte offsets >= 0")
	}
	if set["stderr-cursor"] && *f.stream != "both" {
		return since, usagef("logs", "--stderr-cursor is for both streams: with --stream, use --cursor")
	}
	if *f.tail < -1 {
		return since, usagef("logs", "--tail %d: want a line count >= 0", *f.tail)
	}
	if *f.tail >= 0 && (set["cursor"] || set["stderr-cursor"]) {
		return since, usagef("logs", "--tail and --cursor exclude each other")
	}
	return since, nil
}

func logsCmd(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
	f := registerLogsFlags(fs)
	return func(ctx context.Context, e *env, pos, _ []string) error {
		name, id := pos[0], pos[1]
		since, err := f.check(flagsSet(fs))
		if err != nil {
			return err
		}
		c, err := e.client()
		if err != nil {
			return err
		}
		what := "logs " + name + " " + id
		sctx, scancel := e.callCtx(ctx)
		s, err := c.Session(sctx, name, id)
		scancel()
		if err != nil {
			return fail(what, err)
		}
		streams := []string{*f.stream}
		if *f.stream == "both" {
			streams = s.Streams
			if len(streams) == 0 {
				streams = []string{"stdout"}
			}
		} else if s.TTY && *f.stream == "stderr" {
			return usagef("logs", "a TTY session has only stdout")
		}
		cur := map[string]int64{"stdout": *f.cursor, "stderr": *f.stderrCursor}
		if *f.stream == "stderr" {
			cur["stderr"] = *f.cursor
		}
		if *f.tail >= 0 {
			for _, st := range streams {
				if cur[st], err = tailLines(ctx, e, c, name, id, st, lengthOf(s, st), *f.tail); err != nil {
					return fail(what, err)
				}
			}
		}
		if len(streams) == 1 {
			return logsOne(ctx, e, c, what, name, id, streams[0], cur[streams[0]], since, *f.follow, *f.timestamps)
		}
		if !since.IsZero() {
			if err := sinceCursors(ctx, e, c, name, id, streams, since, cur); err != nil {
				return fail(what, err)
			}
		}
		s.Sandbox = name
		return logsBoth(ctx, e, c, what, s, client.Cursors{Stdout: cur["stdout"], Stderr: cur["stderr"]}, *f.follow, *f.timestamps)
	}
}

// sinceCursors sets in cur each stream's first byte written since since,
// from the stream endpoint's header: an attach to both streams then goes
// by cursors, and knows where the end of what exists now is for both.
func sinceCursors(ctx context.Context, e *env, c *client.Client, name, id string, streams []string, since time.Time, cur map[string]int64) error {
	for _, st := range streams {
		cctx, cancel := e.callCtx(ctx)
		body, err := c.StreamSince(cctx, name, id, st, since, false)
		if err != nil {
			cancel()
			return err
		}
		cur[st] = body.Start()
		body.Close()
		cancel()
	}
	return nil
}

// lengthOf is stream's length as s says (its exit's, once ended).
func lengthOf(s wire.Session, stream string) int64 {
	if s.Exit != nil && s.Exit.Lengths != nil {
		return s.Exit.Lengths[stream]
	}
	return s.Lengths[stream]
}

// tailLines returns the cursor of the last n lines of stream, whose
// length is end: just after the n-th newline before the end (a newline
// that ends the stream ends its last line and is not counted), or 0.
// It reads the stream backwards, a growing window at a time.
func tailLines(ctx context.Context, e *env, c *client.Client, name, id, stream string, end, n int64) (int64, error) {
	if n == 0 || end == 0 {
		return end, nil
	}
	for window := int64(64 << 10); ; window *= 4 {
		from := max(end-window, 0)
		cctx, cancel := e.callCtx(ctx)
		body, err := c.Stream(cctx, name, id, stream, from, false)
		if err != nil {
			cancel()
			return 0, err
		}
		b, err := io.ReadAll(io.LimitReader(body, end-from))
		body.Close()
		cancel()
		if err != nil {
			return 0, err
		}
		if int64(len(b)) < end-from {
			return 0, &adapter.UnavailableError{Detail: fmt.Sprintf("%s: read %d of %d bytes before the end", stream, len(b), end-from)}
		}
		if i := nthNewlineFromEnd(b, n); i >= 0 {
			return from + int64(i) + 1, nil
		}
		if from == 0 {
			return 0, nil
		}
	}
}

// nthNewlineFromEnd is the index of the n-th newline of b counted from its
// end, a newline in b's last byte not counted; -1 when b has fewer.
func nthNewlineFromEnd(b []byte, n int64) int {
	if len(b) > 0 && b[len(b)-1] == '\n' {
		b = b[:len(b)-1]
	}
	for ; n > 0; n-- {
		i := bytes.LastIndexByte(b, '\n')
		if i < 0 {
			return -1
		}
		if n == 1 {
			return i
		}
		b = b[:i]
	}
	return -1
}

// logsOne prints one stream through the plain stream endpoint.
func logsOne(ctx context.Context, e *env, c *client.Client, what, name, id, stream string, cursor int64, since time.Time, follow, timestamps bool) error {
	if !follow {
		var cancel context.CancelFunc
		ctx, cancel = e.callCtx(ctx)
		defer cancel()
	}
	var body *client.StreamBody
	var err error
	if since.IsZero() {
		body, err = c.Stream(ctx, name, id, stream, cursor, follow)
	} else {
		body, err = c.StreamSince(ctx, name, id, stream, since, follow)
	}
	if err != nil {
		return failHint(what, err, errors.Is(err, adapter.ErrTruncated),
			"the start of this stream is no longer retained: pass a larger --cursor")
	}
	defer body.Close()
	// One stream asked for by name goes to stdout, so it can be piped.
	var out io.Writer = e.io.out
	var st *stamper
	if timestamps {
		st = newStamper(ctx, e, c, name, id, stream, e.io.out, body.Start())
		out = st
	}
	_, cerr := io.Copy(out, body)
	if st != nil && st.err != nil {
		return fail(what, st.err)
	}
	next := body.Start() + body.N() // a --since read resumes by cursor
	resume := fmt.Sprintf("runner logs %s %s --stream %s --cursor %d", name, id, stream, next)
	if cerr != nil {
		return &cliError{what: what, err: cerr, hint: "the connection was cut; resume with: " + resume}
	}
	end, err := body.End()
	if err != nil {
		return &cliError{what: what, err: err, hint: "resume with: " + resume}
	}
	switch end.How {
	case "lost":
		return &exitError{code: exitLost, kind: "lost", what: what, msg: fmt.Sprintf("runner: %s: lost: the session ended without an exit record", what)}
	case "error":
		return failHint(what, end.Err, errors.Is(end.Err, adapter.ErrTruncated),
			"retention dropped bytes before they were read: pass a larger --cursor")
	}
	return nil
}

// logsBoth prints both streams of a pipes session through the attach
// stream, stdout to stdout and stderr to stderr, in the order runnerd
// journaled them. Without follow it stops at the lengths s gave (what
// exists now).
func logsBoth(ctx context.Context, e *env, c *client.Client, what string, s wire.Session, cur client.Cursors, follow, timestamps bool) error {
	name, id := s.Sandbox, s.ID
	fr, err := c.Attach(ctx, name, id, cur)
	if err != nil {
		return failHint(what, err, errors.Is(err, adapter.ErrTruncated),
			"the start of a stream is no longer retained: pass larger cursors")
	}
	defer fr.Close()
	var stamps map[wire.StreamID]*stamper
	if timestamps {
		stamps = map[wire.StreamID]*stamper{
			wire.StreamStdout: newStamper(ctx, e, c, name, id, "stdout", e.io.out, cur.Stdout),
			wire.StreamStderr: newStamper(ctx, e, c, name, id, "stderr", e.io.err, cur.Stderr),
		}
	}
	endOut, endErr := lengthOf(s, "stdout"), lengthOf(s, "stderr")
	atEnd := func() bool {
		got := fr.Cursors()
		return got.Stdout >= endOut && got.Stderr >= endErr
	}
	if !follow && s.State == wire.SessionRunning && atEnd() {
		return nil
	}
	for {
		f, err := fr.Next()
		if err != nil {
			got := fr.Cursors()
			return &cliError{what: what, err: err, hint: fmt.Sprintf("resume with: runner logs %s %s --cursor %d --stderr-cursor %d", name, id, got.Stdout, got.Stderr)}
		}
		switch {
		case f.Kind == wire.FrameData:
			var w io.Writer = e.io.out
			if f.Stream == wire.StreamStderr {
				w = e.io.err
			}
			if st := stamps[f.Stream]; st != nil {
				st.pos, w = f.Offset, st
			}
			if _, err := w.Write(f.Payload); err != nil {
				if errors.Is(err, syscall.EPIPE) {
					return errBrokenPipe
				}
				if st := stamps[f.Stream]; st != nil && st.err != nil {
					return fail(what, st.err)
				}
				return &exitError{code: exitOther, kind: "io", what: what, msg: fmt.Sprintf("runner: %s: write: %v", what, err)}
			}
			if !follow && s.State == wire.SessionRunning && atEnd() {
				return nil
			}
		case f.Kind == wire.FrameLost:
			return &exitError{code: exitLost, kind: "lost", what: what, msg: fmt.Sprintf("runner: %s: lost: the session ended without an exit record", what)}
		case f.Kind == wire.FrameError:
			return e.endOf(ctx, c, what, name, f) // the error frame's code and detail
		case f.Kind.Terminal():
			return nil // the exit: logs prints output, not the command's code
		}
	}
}
