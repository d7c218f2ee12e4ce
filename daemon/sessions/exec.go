package sessions

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/agentrunner/runner/daemon/apierr"
	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/journal"
	"github.com/agentrunner/runner/shim/launch"
	"github.com/agentrunner/runner/shim/sessiondir"
	"github.com/agentrunner/runner/wire"
)

// execGrace is the SIGTERM grace when an exec's timeout elapses.
const execGrace = time.Second

// capture is one stream of an exec: the first MaxExecOutput bytes, and
// whether more followed.
type capture struct {
	data      []byte
	truncated bool
	err       error // io.EOF or journal.ErrLost at a normal end
}

func captureStream(ctx context.Context, rd *journal.Reader) capture {
	var c capture
	buf := make([]byte, ChunkSize)
	for {
		n, err := rd.ReadContext(ctx, buf)
		if n > 0 {
			room := wire.MaxExecOutput - len(c.data)
			if n > room {
				c.truncated = true
				n = max(room, 0)
			}
			c.data = append(c.data, buf[:n]...)
		}
		if err != nil {
			c.err = err
			return c
		}
	}
}

// execStdin gives an exec's command its stdin and then EOF, so that it
// never waits for input that will not come. It runs under its own bounded
// context, not the request's: a client that leaves does not leave the
// command without EOF. A retry of the same exec (created false) does not
// send the bytes again (stdin is not idempotent: they may have arrived) but
// closes stdin, which is idempotent, so a retry after runnerd died between
// Spawn and stdin cannot hang the command either. When the bytes or the EOF
// cannot be delivered to a command that still runs, the command is
// terminated and the exec answers unavailable: an exec whose input is
// unknown has no trustworthy result.
func (s *Manager) execStdin(ctx context.Context, ss registry.Session, stdin []byte, created bool) error {
	c, ctx, cancel, err := launch.DialFor(context.WithoutCancel(ctx), s.Dir(ss), launch.Control)
	defer cancel()
	if err == nil {
		if created && len(stdin) > 0 {
			err = c.WriteStdin(ctx, stdin)
		}
		if err == nil {
			err = c.CloseStdin(ctx)
		}
		c.Close()
	}
	if err == nil || errors.Is(err, sessiondir.ErrExited) {
		return nil // a command that exits before reading is not an error here
	}
	s.log.Warn("exec stdin not delivered; terminating the command", "sandbox", ss.Sandbox, "session", ss.ID, "err", err)
	if _, terr := s.Terminate(context.WithoutCancel(ctx), ss, execGrace); terr != nil {
		return apierr.Uncertain("exec stdin not delivered (%v), and the command's end is not confirmed (%v)", err, terr)
	}
	return apierr.Unavailable("exec stdin not delivered, the command was terminated: %v", err)
}

// execRetryAfter is the wait a rate_limited exec answer asks for.
const execRetryAfter = time.Second

// AcquireExec takes one of Config.MaxExecs exec slots, or answers
// rate_limited at once: an exec holds up to twice wire.MaxExecOutput plus
// its JSON answer, so the bound is what keeps runnerd's memory bounded.
// The slot is taken before the body is read: a refused exec costs nothing.
func (s *Manager) AcquireExec() (release func(), err error) {
	select {
	case s.execs <- struct{}{}:
		return func() { <-s.execs }, nil
	default:
		return nil, &apierr.Error{
			Status:       http.StatusTooManyRequests,
			Code:         wire.CodeRateLimited,
			Detail:       fmt.Sprintf("%d execs in flight (runnerd --max-execs)", cap(s.execs)),
			RetryAfterMS: execRetryAfter.Milliseconds(),
		}
	}
}

// ErrExecLeft is returned by exec when its ctx ends before the command
// does (the client left or runnerd stops); the command keeps running.
var ErrExecLeft = errors.New("exec left before its command ended")

// Exec runs req's command in sandbox name to its end (or its timeout) and
// calls answer with its output and exit before it lets go of the journal.
func (s *Manager) Exec(ctx context.Context, name string, req wire.Exec, answer func(wire.ExecResult)) error {
	// With no stdin to send, the command starts with stdin at EOF; a
	// session that was there already (a retried id) is closed as before.
	noStdin := len(req.Stdin) == 0
	ss, created, err := s.Spawn(ctx, name, wire.CreateSession{
		ID: req.ID, Argv: req.Argv, Env: req.Env, Cwd: req.Cwd, User: req.User,
	}, SpawnOptions{StdinClosed: noStdin})
	if err != nil {
		return err
	}
	if !created || !noStdin {
		if err := s.execStdin(ctx, ss, req.Stdin, created); err != nil {
			return err
		}
	}
	j, err := s.OpenJournal(ss)
	if err != nil {
		return err
	}
	// The readers and the journal are closed after the answer, off the
	// request's path: closing a follow reader closes its inotify
	// descriptor, which waits out an fsnotify grace period (~15 ms here),
	// and neither this answer nor the next request on the connection
	// should pay that (bench: exec round trip went from spawn + 15 ms to
	// spawn + 1.5 ms). The closer is tracked, so Run waits for it.
	var readers []*journal.Reader
	defer s.life.Later(func() {
		for _, rd := range readers {
			rd.Close()
		}
		j.Close()
	})

	rctx, rcancel := context.WithCancel(ctx)
	defer rcancel()
	caps, finished, err := s.startCaptures(rctx, j, &readers)
	if err != nil {
		rcancel()
		<-finished
		return err
	}
	timedOut, err := s.awaitExec(ctx, ss, req.TimeoutMS, finished, rcancel)
	if err != nil {
		return err
	}
	lost := false
	for _, c := range caps {
		switch {
		case errors.Is(c.err, io.EOF):
		case errors.Is(c.err, journal.ErrLost):
			lost = true
		default:
			return c.err
		}
	}
	exit, err := s.FinalExit(ss, j, lost)
	if err != nil {
		return err
	}
	// Exec owns its session from spawn to result (no reader): its exit is
	// committed before the answer is written, as a pending commit, so a
	// stdin write that follows the result waits for it (StdinSession); the
	// exit watch then finds it recorded and writes nothing.
	s.RecordExitLater(ss, exit)
	answer(wire.ExecResult{
		Session:         ss.ID,
		Stdout:          nonNil(caps[0].data),
		Stderr:          nonNil(caps[1].data),
		StdoutTruncated: caps[0].truncated,
		StderrTruncated: caps[1].truncated,
		TimedOut:        timedOut,
		Exit:            exit,
	})
	return nil
}

// startCaptures opens a follow reader on each of j's streams (appended to
// *readers, which the caller closes) and captures it until rctx ends or
// the stream does; finished is closed once every capture has returned,
// also when startCaptures fails part way.
func (s *Manager) startCaptures(rctx context.Context, j *journal.Journal, readers *[]*journal.Reader) (caps []capture, finished chan struct{}, err error) {
	streams := StreamsOf(false)
	caps = make([]capture, len(streams))
	var wg sync.WaitGroup
	finished = make(chan struct{})
	for i, stream := range streams {
		rd, err := s.OpenReader(j, stream, 0, true)
		if err != nil {
			go func() { wg.Wait(); close(finished) }()
			return nil, finished, err
		}
		*readers = append(*readers, rd)
		wg.Add(1)
		go func() {
			defer wg.Done()
			caps[i] = captureStream(rctx, rd)
		}()
	}
	go func() { wg.Wait(); close(finished) }()
	return caps, finished, nil
}

// awaitExec waits for an exec's captures to finish: at its timeout it
// terminates the command (timedOut), on storage it cannot write it
// terminates the command and fails with no_space, and when ctx ends it
// fails with ErrExecLeft. Each way out waits for the captures.
func (s *Manager) awaitExec(ctx context.Context, ss registry.Session, timeoutMS int, finished <-chan struct{}, rcancel context.CancelFunc) (timedOut bool, err error) {
	var timeout <-chan time.Time
	if timeoutMS > 0 {
		t := time.NewTimer(time.Duration(timeoutMS) * time.Millisecond)
		defer t.Stop()
		timeout = t.C
	}
	// An exec whose output cannot be stored (a full disk) would wait for
	// space with no answer: watch for that (diskfull.go, execStuck).
	watch := time.NewTicker(execStorageCheck)
	defer watch.Stop()
	strikes := 0
	for {
		select {
		case <-finished:
			return false, nil
		case <-timeout:
			if _, err := s.Terminate(ctx, ss, execGrace); err != nil {
				rcancel()
				<-finished
				return true, err
			}
			<-finished // the exit record is in: the readers end at once
			return true, nil
		case <-watch.C:
			werr := s.execStuck(ctx, ss, &strikes)
			if werr == "" {
				continue
			}
			e, err := s.Terminate(ctx, ss, execGrace)
			rcancel()
			<-finished
			if err == nil {
				var lost int64
				if e.Exit != nil {
					lost = e.Exit.UnstoredBytes
				}
				err = apierr.NoSpace("exec", fmt.Errorf("its output could not be stored (%s); the command was terminated (%d bytes not stored)", werr, lost))
			}
			return false, err
		case <-ctx.Done():
			rcancel()
			<-finished
			return false, ErrExecLeft
		}
	}
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
