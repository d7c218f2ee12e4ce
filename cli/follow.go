package cli

// follow: the one loop behind attach, exec and run. It streams a
// session's frames to stdout and stderr as they are journaled (with
// reconnection across runnerd restarts), forwards stdin (raw and
// byte by byte on a terminal, or chunk by chunk from a pipe), follows
// the terminal's size, and decides what a detach key or a signal means.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	units "github.com/docker/go-units"
	"golang.org/x/term"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/wire"
)

// followOpts say how to follow one session.
type followOpts struct {
	what     string // "attach web-1 sh", "exec web-1": the op in messages
	name, id string
	s        wire.Session // as spawned or read: TTY and state matter
	cur      client.Cursors
	since    time.Time
	key      byte // the detach key, when useKey
	useKey   bool
	// stdin forwards runner's stdin: on a terminal in raw mode (a TTY
	// session), else chunk by chunk as it is read, closing the
	// session's stdin at EOF (a pipes session).
	stdin bool
	// exec: Ctrl-C (SIGINT) and SIGTERM are forwarded to the command and
	// runner keeps waiting; a second one stops waiting (130). Without it
	// (attach) a signal detaches (245), as the detach key does.
	exec bool
	// owned: this runner started the session (exec, or run that did
	// not rejoin one), so a broken pipe on runner's output ends it.
	owned bool
	// maxTime > 0 terminates the command (1 s grace) that long after
	// follow starts; the result says so.
	maxTime time.Duration
	// out and errw receive the streams' bytes (default runner's own).
	out, errw io.Writer
}

// followResult is how a follow ended: the terminal frame (exit, lost or
// error) and whether --max-time terminated the command.
type followResult struct {
	frame    wire.Frame
	timedOut bool
}

// follow attaches to o's session and streams it until its terminal
// frame. The error is runner's final word for a detach (245), a
// second Ctrl-C of exec (130) or a transport failure it could not
// recover; the terminal frame is the caller's to turn into an exit.
func (e *env) follow(ctx context.Context, c *client.Client, o followOpts) (followResult, error) {
	name, id, s, what := o.name, o.id, o.s, o.what
	if o.out == nil {
		o.out = e.io.out
	}
	if o.errw == nil {
		o.errw = e.io.err
	}
	running := s.State == wire.SessionRunning
	inFd := int(e.io.in.Fd())
	interactive := s.TTY && running && o.stdin && term.IsTerminal(inFd)
	forwardStdin := running && o.stdin

	actx, acancel := context.WithCancel(ctx)
	defer acancel()
	a := &attachRun{c: c, e: e, name: name, id: id, ctx: actx, cancel: acancel,
		cur: o.cur, since: o.since, tty: s.TTY, byTime: !o.since.IsZero()}
	if o.exec {
		a.lostMsg = fmt.Sprintf("connection to runnerd lost; rejoining session %s (the command keeps running)...", id)
	}

	// From here on, the terminal may be raw: every message goes
	// through notice (CR LF there) and the terminal is restored before
	// runner prints its final word.
	restore := func() {}
	if interactive {
		var err error
		if restore, err = rawTerminal(inFd, what); err != nil {
			return followResult{}, err
		}
		defer restore()
	}
	notice := e.noticer(interactive)

	var wg sync.WaitGroup
	done := make(chan struct{})                          // closed when runner is finishing
	defer func() { acancel(); close(done); wg.Wait() }() // acancel first: a pending terminate or resize returns

	// Follow the terminal's size.
	if s.TTY && running {
		e.followSize(actx, c, name, id, done, &wg)
	}

	// Signals (in raw mode Ctrl-C is a key and goes to the session).
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)

	// The stdin forwarder (stdinq.go): its reader may stay blocked in a
	// read of runner's stdin when runner finishes (runner exits right
	// after, so it is not waited for); its writer is waited for.
	detached := make(chan struct{}, 1)
	if forwardStdin {
		fw := &stdinForwarder{e: e, c: c, name: name, id: id, in: e.io.in, tty: s.TTY,
			key: o.key, useKey: interactive && o.useKey, notice: notice, q: newStdinQueue()}
		go fw.read(actx, detached)
		wg.Go(func() { fw.write(actx) })
	}

	// --max-time: terminate once, then keep reading to the exit frame.
	var timedOut bool
	var deadline <-chan time.Time
	if o.maxTime > 0 && running {
		t := time.NewTimer(o.maxTime)
		defer t.Stop()
		deadline = t.C
	}

	results := make(chan pumpResult, 1)
	wg.Go(func() { results <- a.pump(o.out, o.errw, notice) })

	var res pumpResult
	stopCode := 0
	signals := 0
wait:
	for {
		select {
		case res = <-results:
			break wait
		case <-detached:
			stopCode = exitDetached
			break wait
		case <-deadline:
			timedOut = true
			wg.Go(func() { e.terminateAtMaxTime(actx, c, o, notice) })
		case sg := <-sigs:
			if !o.exec || interactive {
				stopCode = exitDetached
				break wait
			}
			signals++
			if signals > 1 {
				stopCode = exitInterrupted
				break wait
			}
			e.forwardSignal(ctx, c, name, id, sg, notice)
		}
	}
	if stopCode != 0 {
		a.stop()
		res = <-results
		if res.frame == nil {
			restore()
			return followResult{}, stoppedError(o, a, stopCode)
		}
	}
	restore()
	if res.frame == nil {
		return followResult{}, e.followFailed(ctx, c, o, a, res.err, running)
	}
	return followResult{frame: *res.frame, timedOut: timedOut}, nil
}

// rawTerminal puts the terminal fd in raw mode; restore (idempotent)
// puts it back.
func rawTerminal(fd int, what string) (restore func(), err error) {
	old, err := term.MakeRaw(fd)
	if err != nil {
		return nil, &exitError{code: exitOther, kind: "io", what: what, msg: fmt.Sprintf("runner: %s: put the terminal in raw mode: %v", what, err)}
	}
	var once sync.Once
	return func() { once.Do(func() { _ = term.Restore(fd, old) }) }, nil
}

// terminateAtMaxTime ends the session once --max-time has passed
// (SIGTERM, SIGKILL a second later); follow keeps reading to its exit.
// ctx ends with follow, and then a failure is nobody's news.
func (e *env) terminateAtMaxTime(ctx context.Context, c *client.Client, o followOpts, notice func(string)) {
	tctx, cancel := context.WithTimeout(ctx, e.g.timeout+10*time.Second)
	defer cancel()
	if _, err := c.Terminate(tctx, o.name, o.id, time.Second); err != nil && ctx.Err() == nil {
		notice(fmt.Sprintf("--max-time %s: could not terminate %s: %s", o.maxTime, o.id, oneLine(detailOf(err))))
	}
}

// noticer is how follow tells a person something while it runs: on a
// raw terminal with CR LF, with --json as a warning object, else a
// "runner: " line; one message at a time.
func (e *env) noticer(interactive bool) func(msg string) {
	var mu sync.Mutex // one message at a time on stderr
	return func(msg string) {
		mu.Lock()
		defer mu.Unlock()
		if interactive {
			fmt.Fprintf(e.io.err, "\r\nrunner: %s\r\n", msg)
		} else if e.g.json {
			writeJSONWarning(e, msg)
		} else {
			fmt.Fprintf(e.io.err, "runner: %s\n", msg)
		}
	}
}

// followSize gives the session this terminal's size, now and at each
// SIGWINCH, until done is closed; wg waits for the goroutine it starts.
func (e *env) followSize(ctx context.Context, c *client.Client, name, id string, done <-chan struct{}, wg *sync.WaitGroup) {
	sizeFd, ok := terminalFd(e)
	if !ok {
		return
	}
	resize := func() {
		w, h, err := term.GetSize(sizeFd)
		if err != nil || w <= 0 || h <= 0 {
			return
		}
		rctx, cancel := e.callCtx(ctx)
		defer cancel()
		_ = c.Resize(rctx, name, id, h, w) // a resize racing the exit is harmless
	}
	resize()
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	wg.Go(func() {
		defer signal.Stop(winch)
		for {
			select {
			case <-done:
				return
			case <-winch:
				resize()
			}
		}
	})
}

// forwardSignal sends the signal runner got (SIGINT, SIGTERM, SIGHUP) to
// the session exec started, and says whether it went.
func (e *env) forwardSignal(ctx context.Context, c *client.Client, name, id string, sg os.Signal, notice func(string)) {
	sig := "INT"
	switch sg {
	case syscall.SIGTERM:
		sig = "TERM"
	case syscall.SIGHUP:
		sig = "HUP"
	}
	sctx, scancel := e.callCtx(ctx)
	err := c.Signal(sctx, name, id, sig)
	scancel()
	if err != nil && !errors.Is(err, adapter.ErrCommandExited) {
		notice(fmt.Sprintf("could not forward SIG%s: %s", sig, oneLine(detailOf(err))))
	} else if err == nil {
		notice(fmt.Sprintf("sent SIG%s to %s; Ctrl-C again to stop waiting (the command keeps running)", sig, id))
	}
}

// stoppedError is runner's end when it stopped following before the
// session ended: interrupted (a second Ctrl-C) or detached, with how to
// find the session again.
func stoppedError(o followOpts, a *attachRun, stopCode int) error {
	what, name, id := o.what, o.name, o.id
	if stopCode == exitInterrupted {
		return &exitError{code: exitInterrupted, kind: "interrupted", what: what, msg: fmt.Sprintf(
			"runner: %s: stopped waiting; the command may still run\nrunner: hint: runner logs %s %s -f   |   runner terminate %s %s",
			what, name, id, name, id)}
	}
	again := fmt.Sprintf("runner attach %s %s %s%s", name, id, a.resumeFlags(), detachKeyFlag(o.key, o.useKey))
	msg := fmt.Sprintf("\r\nrunner: detached from %s %s; it keeps running.\nrunner: reattach with: %s\n"+
		"runner: (that shows only what is new; without the cursors it replays the session from its start)", name, id, again)
	return &exitError{code: exitDetached, kind: "detached", what: what, msg: msg}
}

// followFailed is runner's end when following ended with no end frame
// (err): a broken output pipe ends the command exec started; anything
// else says how to find the session again.
func (e *env) followFailed(ctx context.Context, c *client.Client, o followOpts, a *attachRun, err error, running bool) error {
	if errors.Is(err, errBrokenPipe) {
		// Nobody reads runner's output any more (| head): as ssh does,
		// end the command exec started, and exit as a SIGPIPE death
		// reads in a shell. attach only watches: its session runs on.
		if o.exec && o.owned && running {
			e.stopOnBrokenPipe(ctx, c, o.what, o.name, o.id)
		}
		return err
	}
	ce := &cliError{what: o.what, err: err}
	if errors.Is(err, adapter.ErrUnavailable) {
		ce.hint = hints(hintFor(err, e.where), fmt.Sprintf("the session may still run; reattach with: runner attach %s %s %s", o.name, o.id, a.resumeFlags()))
	} else if errors.Is(err, adapter.ErrTruncated) {
		ce.hint = "that cursor is behind the retained output: pass a larger --cursor"
	}
	return ce
}

// pipeGrace is how long a command has to end on the SIGPIPE runner sends
// once its own output pipe broke, before terminate (SIGTERM, SIGKILL
// 1 s later) ends it.
const pipeGrace = 50 * time.Millisecond

// stopOnBrokenPipe ends session id after runner's stdout or stderr
// broke: SIGPIPE first (what the command would get writing into the
// pipe itself, and what `yes` dies of), then terminate if it still runs
// after pipeGrace. It waits for the end, bounded, so that runner never
// exits leaving the command writing into its journal unread.
func (e *env) stopOnBrokenPipe(ctx context.Context, c *client.Client, what, name, id string) {
	ctx, cancel := context.WithTimeout(ctx, e.g.timeout+10*time.Second)
	defer cancel()
	err := c.Signal(ctx, name, id, "PIPE")
	if errors.Is(err, adapter.ErrCommandExited) {
		return
	}
	if err == nil {
		for deadline := time.Now().Add(pipeGrace); time.Now().Before(deadline); {
			if s, err := c.Session(ctx, name, id); err == nil && s.State != wire.SessionRunning {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if _, err := c.Terminate(ctx, name, id, time.Second); err != nil && !errors.Is(err, adapter.ErrCommandExited) {
		// stderr may be the pipe that broke; then nobody reads this.
		fmt.Fprintf(e.io.err, "runner: %s: could not end session %s after its output pipe closed: %s\nrunner: hint: runner terminate %s %s\n",
			what, id, oneLine(detailOf(err)), name, id)
	}
}

// terminalFd is the descriptor whose size a TTY session follows:
// runner's stdout when it is a terminal, else its stdin.
func terminalFd(e *env) (int, bool) {
	if fd := int(e.io.out.Fd()); term.IsTerminal(fd) {
		return fd, true
	}
	if fd := int(e.io.in.Fd()); term.IsTerminal(fd) {
		return fd, true
	}
	return 0, false
}

// memoryLimit is sandbox name's memory limit for a message: "64MiB", or
// "of its sandbox" when it cannot be read now.
func (e *env) memoryLimit(ctx context.Context, c *client.Client, name string) string {
	cctx, cancel := e.callCtx(ctx)
	defer cancel()
	sb, err := c.GetSandbox(cctx, name)
	if err != nil || sb.Limits == nil || sb.Limits.MemoryBytes == 0 {
		return "of its sandbox"
	}
	return units.BytesSize(float64(sb.Limits.MemoryBytes))
}

// endOf turns a session's terminal frame into runner's exit: the
// command's status, lost (254), or the error frame's code.
func (e *env) endOf(ctx context.Context, c *client.Client, what, name string, f wire.Frame) error {
	switch f.Kind {
	case wire.FrameExit, wire.FrameLost:
		x, err := f.Exit()
		if err != nil {
			return fail(what, &adapter.UnavailableError{Detail: "decode the exit frame: " + err.Error()})
		}
		if f.Kind == wire.FrameLost {
			x.Reason = wire.ExitLost
		}
		limit := ""
		if x.OOMKilled {
			limit = e.memoryLimit(ctx, c, name)
		}
		return exitErrorOf(what, x, limit)
	}
	we, err := f.Err()
	if err != nil {
		return fail(what, &adapter.UnavailableError{Detail: "decode the error frame: " + err.Error()})
	}
	code := exitOther
	if row, ok := wire.RowOf(we.Code); ok {
		code = row.Exit
	}
	msg := fmt.Sprintf("runner: %s: %s: %s", what, we.Code, oneLine(we.Detail))
	if we.Code == wire.CodeTruncated {
		msg += "\nrunner: hint: retention dropped output before it was read; reattach with a larger --cursor"
	}
	return &exitError{code: code, kind: string(we.Code), what: what, msg: msg}
}
