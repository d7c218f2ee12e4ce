package fake

import (
	"slices"
	"time"

	"github.com/agentrunner/runner/adapter"
)

const (
	sigTERM = "SIGTERM"
	sigKILL = "SIGKILL"
)

// maxFrame caps the bytes of one data frame.
const maxFrame = 32 << 10

// session is one command's state. Every field is guarded by driver.mu.
type session struct {
	id      string
	cmd     adapter.Command
	tty     *adapter.TTYSize // nil: pipes mode
	hidden  bool             // an Exec: not listed, not attachable
	started time.Time

	out         [2][]byte // the journal: stdout, stderr (always empty in TTY mode)
	stdin       []byte    // written, not yet read
	stdinClosed bool

	exit *adapter.Exit // set once, after the last output byte
	lost bool          // ended without an exit record (destroyed, adapter closed)

	term, kill  chan struct{} // closed to deliver SIGTERM / SIGKILL
	terminating bool          // a contract call asked it to stop: ReasonTerminated
	changed     chan struct{} // closed and replaced on every change
	done        chan struct{} // closed when the process goroutine ended
}

func newSession(id string, c adapter.Command, tty *adapter.TTYSize, hidden bool) *session {
	s := &session{
		id:      id,
		cmd:     adapter.Command{Path: c.Path, Args: slices.Clone(c.Args), Env: slices.Clone(c.Env), Dir: c.Dir},
		hidden:  hidden,
		started: time.Now(),
		term:    make(chan struct{}),
		kill:    make(chan struct{}),
		changed: make(chan struct{}),
		done:    make(chan struct{}),
	}
	if tty != nil {
		t := *tty
		s.tty = &t
	}
	return s
}

func (s *session) ended() bool { return s.exit != nil || s.lost }

// broadcast wakes every reader and the process.
func (s *session) broadcast() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// signal delivers SIGTERM or SIGKILL; repeats are no-ops.
func (s *session) signal(sig string) {
	ch := s.term
	if sig == sigKILL {
		ch = s.kill
	}
	select {
	case <-ch:
	default:
		close(ch)
	}
}

// stop kills the command for a contract call (suspend, destroy, a canceled
// exec, Close). lost marks it as ending without an exit record.
func (s *session) stop(lost bool) {
	if s.ended() {
		return
	}
	s.terminating = true
	if lost {
		s.lost = true
	}
	s.signal(sigKILL)
	s.broadcast()
}

func (s *session) info() adapter.SessionInfo {
	in := adapter.SessionInfo{
		ID:      s.id,
		Command: s.cmd,
		TTY:     s.tty != nil,
		State:   adapter.SessionRunning,
		Stdout:  int64(len(s.out[0])),
		Stderr:  int64(len(s.out[1])),
		Started: s.started,
	}
	switch {
	case s.lost:
		in.State = adapter.SessionLost
	case s.exit != nil:
		in.State = adapter.SessionExited
		e := *s.exit
		in.Exit = &e
	}
	return in
}

// follow starts a reader that streams s from the cursor; a.mu is held.
func (a *driver) follow(s *session, from adapter.Cursor, buffer int) adapter.Stream {
	if buffer <= 0 {
		buffer = a.buffer
	}
	f := adapter.NewFeed(s.id, buffer, nil)
	a.reads.Add(1)
	go func() {
		defer a.reads.Done()
		a.read(s, f, [2]int64{from.Stdout, from.Stderr})
	}()
	return f
}

var streams = [2]adapter.StreamName{adapter.Stdout, adapter.Stderr}

// read sends what the journal holds past pos, waits for more, and ends with
// the one terminal frame once the journal is complete.
func (a *driver) read(s *session, f *adapter.Feed, pos [2]int64) {
	for {
		a.mu.Lock()
		var frames []adapter.Frame
		for i := range 2 {
			for off := pos[i]; off < int64(len(s.out[i])); off += maxFrame {
				end := min(off+maxFrame, int64(len(s.out[i])))
				frames = append(frames, adapter.Frame{Stream: streams[i], Offset: off, Data: slices.Clone(s.out[i][off:end])})
			}
			pos[i] = int64(len(s.out[i]))
		}
		var last *adapter.Frame
		switch {
		case len(frames) > 0: // send the data first, then look again
		case s.lost:
			last = &adapter.Frame{Err: adapter.ErrLost}
		case s.exit != nil:
			e := *s.exit
			last = &adapter.Frame{Exit: &e}
		}
		changed := s.changed
		a.mu.Unlock()

		if last != nil {
			frames = append(frames, *last)
		}
		for _, fr := range frames {
			if f.Send(a.ctx, fr) != nil {
				f.Stop()
				return
			}
		}
		if last != nil {
			return
		}
		if len(frames) > 0 {
			continue
		}
		select {
		case <-changed:
		case <-f.Done():
			f.Stop()
			return
		case <-a.ctx.Done():
			f.Stop()
			return
		}
	}
}
