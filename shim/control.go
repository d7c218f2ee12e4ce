package shim

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/agentrunner/runner/journal"
	"github.com/agentrunner/runner/shim/internal/proto"
	"github.com/agentrunner/runner/shim/sessiondir"
	"github.com/agentrunner/runner/wire"
)

// shutdown stops serving: no new connections, idle connections end, and
// in-flight requests get their answers (every one can complete now that
// the exit record is published and nothing is left below the shim).
func (s *server) shutdown() {
	close(s.closing)
	s.ln.Close()
	os.Remove(s.sock)
	s.mu.Lock()
	for c := range s.conns {
		c.CloseRead() // an idle handler sees EOF; a busy one answers first
	}
	s.mu.Unlock()
	waited := make(chan struct{})
	// Owned by shutdown: it ends when every handler has returned.
	go func() { s.handlers.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(closeTimeout):
		s.mu.Lock()
		for c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		<-waited
	}
	s.stdinTurn <- struct{}{}
	if s.master != nil || !s.stdinClosed {
		s.stdin.Close()
	}
	<-s.stdinTurn
}

func (s *server) accept() {
	defer s.handlers.Done()
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			return // listener closed by shutdown
		}
		s.mu.Lock()
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		select {
		case <-s.closing:
			c.CloseRead()
		default:
		}
		s.handlers.Add(1)
		go s.serveConn(c)
	}
}

func (s *server) serveConn(c *net.UnixConn) {
	defer s.handlers.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	var hdr [proto.CtlHdrLen]byte
	var in, out []byte
	for {
		op, body, err := proto.ReadMsg(c, &hdr, in)
		if err != nil {
			if errors.Is(err, proto.ErrProto) {
				proto.WriteMsg(c, out, proto.StError, proto.ErrorBody(proto.CodeInvalid, err.Error()))
			}
			return
		}
		if cap(body) <= 64<<10 {
			in = body // keep small buffers only: an idle connection stays small
		}
		var st byte
		var resp []byte
		usable := true
		if (op == proto.OpWrite && len(body) > 0) || (op == proto.OpWriteAt && len(body) > 8) {
			gone, stop := watchGone(c)
			if op == proto.OpWrite {
				st, resp = s.writeStdin(body, gone)
			} else {
				st, resp = s.writeStdinAt(int64(binary.BigEndian.Uint64(body)), body[8:], gone)
			}
			usable = stop()
		} else {
			st, resp = s.handle(op, body)
		}
		if out, err = proto.WriteMsg(c, out, st, resp); err != nil || !usable {
			return
		}
		if cap(out) > 64<<10 {
			out = nil
		}
	}
}

func (s *server) isExited() bool {
	select {
	case <-s.exited:
		return true
	default:
		return false
	}
}

func (s *server) handle(op byte, body []byte) (byte, []byte) {
	switch op {
	case proto.OpWrite:
		if len(body) == 0 {
			return proto.StOK, s.stdinCount() // a probe: where stdin stands
		}
		return s.writeStdin(body, nil) // serveConn watches its caller (watchGone)
	case proto.OpWriteAt:
		if len(body) < 8 {
			return proto.StError, proto.ErrorBody(proto.CodeInvalid, "write_at wants an offset")
		}
		return s.writeStdinAt(int64(binary.BigEndian.Uint64(body)), body[8:], nil)
	case proto.OpCloseStdin:
		return s.closeStdin()
	case proto.OpResize:
		if len(body) != 4 {
			return proto.StError, proto.ErrorBody(proto.CodeInvalid, "resize wants rows and cols")
		}
		return s.resize(binary.BigEndian.Uint16(body), binary.BigEndian.Uint16(body[2:]))
	case proto.OpSignal:
		if len(body) != 4 {
			return proto.StError, proto.ErrorBody(proto.CodeInvalid, "signal wants a number")
		}
		sig := binary.BigEndian.Uint32(body)
		if sig == 0 || sig > 64 {
			return proto.StError, proto.ErrorBody(proto.CodeInvalid, fmt.Sprintf("no signal %d", sig))
		}
		if s.isExited() {
			return proto.StExited, nil
		}
		if syscall.Signal(sig) == syscall.SIGKILL {
			s.killSent.Store(true) // before the kill: its exit is never an OOM (oomKilled)
		}
		if err := s.signalGroup(syscall.Signal(sig)); err != nil {
			if errors.Is(err, syscall.ESRCH) {
				return proto.StExited, nil
			}
			return proto.StError, proto.ErrorBody(proto.CodeProvider, err.Error())
		}
		return proto.StOK, nil
	case proto.OpTerminate:
		if len(body) != 8 {
			return proto.StError, proto.ErrorBody(proto.CodeInvalid, "terminate wants a grace")
		}
		return s.terminate(time.Duration(binary.BigEndian.Uint64(body)) * time.Millisecond)
	case proto.OpStatus:
		b, _ := json.Marshal(s.status())
		return proto.StOK, b
	case proto.OpOffsetAt:
		return s.offsetAt(body)
	case proto.OpMarks:
		return s.marks(body)
	}
	return proto.StError, proto.ErrorBody(proto.CodeInvalid, fmt.Sprintf("unknown op %d", op))
}

// signalGroup signals the command's process group (the command is its
// session and group leader).
func (s *server) signalGroup(sig syscall.Signal) error {
	return syscall.Kill(-s.pid, sig)
}

// writeStdin writes p to the command's stdin, all of it, unless gone
// closes first: the caller has given up (its connection closed), and the
// write stops where it stands. The bytes already in the pipe or terminal
// stay there (the command reads them); the rest of p is dropped, never
// written later, so what the command reads is every acknowledged write
// whole and of each abandoned one a prefix, in the order they came, none
// twice (docs/frames.md, "Control socket"). A write waiting for its turn
// behind another stops waiting as well. So a command that never reads
// costs the shim one chunk per caller still waiting, none per caller gone.
func (s *server) writeStdin(p []byte, gone <-chan struct{}) (byte, []byte) {
	if s.isExited() {
		return proto.StExited, nil
	}
	select {
	case s.stdinTurn <- struct{}{}:
	case <-gone:
		return abandoned(0, len(p))
	}
	defer func() { <-s.stdinTurn }()
	return s.writeStdinTurn(p, gone)
}

// stdinCount is the answer body of a write: the count of stdin bytes
// written so far, big-endian uint64.
func (s *server) stdinCount() []byte {
	return binary.BigEndian.AppendUint64(nil, uint64(s.stdinBytes.Load()))
}

// writeStdinAt is writeStdin for a caller that says where its bytes go:
// off is the count of stdin bytes that precede p, as the caller knows it.
// The shim's count (stdinBytes) is the truth: when off is behind it, the
// first count-off bytes of p already reached the command (a write the
// caller could not confirm, sent again) and are skipped; when all of p
// did, nothing is written and the answer is OK. When off is ahead of the
// count, bytes the caller believes sent never arrived: the write is
// refused (invalid, nothing written), since writing p would lose them
// silently. So a caller that sends the same bytes again with the same
// offset until one answer says OK delivers each byte exactly once, even
// across runnerd restarts: the count lives in the shim.
func (s *server) writeStdinAt(off int64, p []byte, gone <-chan struct{}) (byte, []byte) {
	select {
	case s.stdinTurn <- struct{}{}:
	case <-gone:
		return abandoned(0, len(p))
	}
	defer func() { <-s.stdinTurn }()
	n := s.stdinBytes.Load()
	switch {
	case off < 0 || off > n:
		return proto.StError, proto.ErrorBody(proto.CodeInvalid, fmt.Sprintf("stdin offset %d is past the %d bytes written: a gap", off, n))
	case off+int64(len(p)) <= n:
		return proto.StOK, s.stdinCount() // all of it was delivered before
	}
	if s.isExited() {
		return proto.StExited, nil
	}
	return s.writeStdinTurn(p[n-off:], gone)
}

// writeStdinTurn writes p for a caller that holds the stdin turn.
func (s *server) writeStdinTurn(p []byte, gone <-chan struct{}) (byte, []byte) {
	if s.stdinClosed {
		return proto.StExited, []byte(proto.CodeClosed)
	}
	// Interrupt the write when the caller goes: a deadline in the past
	// makes the poller return what was written so far.
	var interrupted bool
	written := make(chan struct{})
	watched := make(chan struct{})
	go func() { // owned by writeStdin, which waits for it below
		defer close(watched)
		select {
		case <-gone:
			s.stdin.SetWriteDeadline(time.Now())
			interrupted = true
		case <-written:
		}
	}()
	n, err := s.stdin.Write(p)
	s.stdinBytes.Add(int64(n))
	close(written)
	<-watched
	if interrupted {
		s.stdin.SetWriteDeadline(time.Time{})
		if s.isExited() {
			// The exit's deadline (run) may have been cleared just now.
			s.stdin.SetWriteDeadline(time.Now())
		}
	}
	if s.master != nil && n > 0 {
		s.atLineStart = p[n-1] == '\n' || p[n-1] == '\r'
	}
	if err == nil {
		return proto.StOK, s.stdinCount()
	}
	if s.isExited() {
		return proto.StExited, nil
	}
	if interrupted {
		return abandoned(n, len(p))
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return proto.StExited, nil
	}
	if errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.EIO) {
		// The command closed its stdin. It is about to exit, usually.
		select {
		case <-s.exited:
			return proto.StExited, nil
		case <-time.After(200 * time.Millisecond):
			return proto.StExited, []byte(proto.CodeClosed)
		}
	}
	return proto.StError, proto.ErrorBody(proto.CodeProvider, err.Error())
}

// abandoned is the answer to a stdin write whose caller went away after
// n of its size bytes reached the command. Nobody reads it when the
// caller closed its connection; one that only shut its sending side does.
func abandoned(n, size int) (byte, []byte) {
	return proto.StError, proto.ErrorBody(proto.CodeUnavailable, fmt.Sprintf("stdin write abandoned by its caller: %d of %d bytes delivered", n, size))
}

// watchGone watches c while a request on it is being served: a client
// sends nothing until it has read the answer, so a read that returns
// means it has gone (EOF: it closed its connection, or shut its sending
// side; or shutdown shut ours) or broke the protocol. gone is closed
// then. stop ends the watch, waits for it, and reports whether c can
// carry another request (nothing was read from it).
func watchGone(c *net.UnixConn) (gone <-chan struct{}, stop func() bool) {
	ch := make(chan struct{})
	done := make(chan struct{})
	var n int
	var err error
	go func() { // owned by stop, which every caller calls
		defer close(done)
		var b [1]byte
		n, err = c.Read(b[:])
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			close(ch)
		}
	}()
	return ch, func() bool {
		c.SetReadDeadline(time.Unix(1, 0))
		<-done
		c.SetReadDeadline(time.Time{})
		return n == 0 && errors.Is(err, os.ErrDeadlineExceeded)
	}
}

// closeStdin delivers a real EOF once. Pipes: the write end is closed.
// TTY: the terminal's VEOF character (^D) is written at the start of a
// line, so the line discipline turns it into an end of file for the
// reader: once when the last byte written was a newline (or nothing was
// written), twice otherwise (the first ^D only ends the pending partial
// line). A terminal in raw mode has no EOF; the ^D is then a plain byte.
func (s *server) closeStdin() (byte, []byte) {
	if s.isExited() {
		return proto.StExited, nil
	}
	s.stdinTurn <- struct{}{}
	defer func() { <-s.stdinTurn }()
	if s.stdinClosed {
		return proto.StOK, nil
	}
	var err error
	if s.master != nil {
		c, _ := veofChar(s.master)
		eof := []byte{c}
		if !s.atLineStart {
			eof = append(eof, c)
		}
		_, err = s.master.Write(eof)
	} else {
		err = s.stdin.Close()
	}
	if err != nil && s.isExited() {
		return proto.StExited, nil
	}
	s.stdinClosed = true
	if err != nil {
		return proto.StError, proto.ErrorBody(proto.CodeProvider, err.Error())
	}
	return proto.StOK, nil
}

func (s *server) resize(rows, cols uint16) (byte, []byte) {
	if s.master == nil {
		return proto.StError, proto.ErrorBody(proto.CodeInvalid, "not a TTY session")
	}
	if rows == 0 || cols == 0 {
		return proto.StError, proto.ErrorBody(proto.CodeInvalid, "rows and cols must be at least 1")
	}
	if s.isExited() {
		return proto.StExited, nil
	}
	// The resize also sends SIGWINCH to the foreground group (resizePTY).
	if err := resizePTY(s.master, rows, cols); err != nil {
		return proto.StError, proto.ErrorBody(proto.CodeProvider, err.Error())
	}
	return proto.StOK, nil
}

// terminate stops everything the session started: SIGTERM to the
// command's group and to the group of every other process below the shim,
// SIGKILL after grace to every one still alive, until none is left
// (killTree). It answers with the exit record once it is published. On a
// session whose command has already ended it stops the lingering
// descendants the same way and answers the record.
func (s *server) terminate(grace time.Duration) (byte, []byte) {
	signalled := 0
	if !s.isExited() {
		s.stopAsked.Store(true)
		s.signalGroup(syscall.SIGTERM)
		signalled = s.pid // the command leads its own group
	}
	s.killTree(grace, signalled)
	// Wait for the record, unless the command has ended and the record
	// cannot be written (disk full): that answer is write_failed, at once
	// rather than when the caller gives up. The shim keeps retrying; the
	// record (with Terminated) is published once there is space.
	tick := time.NewTicker(writeFailedPoll)
	defer tick.Stop()
	stuck := 0
	for {
		select {
		case <-s.done:
			s.mu.Lock()
			b, _ := json.Marshal(s.exit)
			s.mu.Unlock()
			return proto.StOK, b
		case <-tick.C:
		}
		s.mu.Lock()
		werr := s.writeErr
		s.mu.Unlock()
		if !s.isExited() || werr == "" {
			stuck = 0
			continue
		}
		if stuck++; stuck >= writeFailedAfter {
			return proto.StError, proto.ErrorBody(proto.CodeWriteFailed, "the command has ended but its exit record cannot be written: "+werr)
		}
	}
}

// A terminate answers write_failed once the command has ended and the
// journal has failed writes for writeFailedAfter polls in a row, so a
// single transient failure does not turn into an error.
const (
	writeFailedPoll  = 50 * time.Millisecond
	writeFailedAfter = 4
)

func (s *server) status() sessiondir.Status {
	st := sessiondir.Status{ID: s.spec.ID, State: sessiondir.StateRunning, ShimPID: os.Getpid(), PID: s.pid, TTY: s.spec.TTY, StartedAt: s.at}
	st.Descendants = s.countDescendants()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.exit != nil {
		e := *s.exit
		st.State, st.Exit = sessiondir.StateExited, &e
	}
	st.WriteError = s.writeErr
	return st
}

func (s *server) offsetAt(body []byte) (byte, []byte) {
	var req proto.OffsetReq
	if err := json.Unmarshal(body, &req); err != nil {
		return proto.StError, proto.ErrorBody(proto.CodeInvalid, "offset_at: "+err.Error())
	}
	t, err := time.Parse(time.RFC3339Nano, req.Time)
	if err != nil {
		return proto.StError, proto.ErrorBody(proto.CodeInvalid, "offset_at: "+err.Error())
	}
	var off int64
	select {
	case <-s.done:
		off, err = sessiondir.OffsetFromDisk(s.dir, req.Stream, t)
	default:
		off, err = s.jw.Load().OffsetAt(req.Stream, t)
		if errors.Is(err, journal.ErrFinished) || errors.Is(err, journal.ErrClosed) {
			<-s.done
			off, err = sessiondir.OffsetFromDisk(s.dir, req.Stream, t)
		}
	}
	if err != nil {
		code := proto.CodeProvider
		if errors.Is(err, journal.ErrUnknownStream) {
			code = proto.CodeInvalid
		}
		return proto.StError, proto.ErrorBody(code, err.Error())
	}
	return proto.StOK, binary.BigEndian.AppendUint64(nil, uint64(off))
}

func (s *server) marks(body []byte) (byte, []byte) {
	var req proto.MarksReq
	if err := json.Unmarshal(body, &req); err != nil || req.From < 0 {
		return proto.StError, proto.ErrorBody(proto.CodeInvalid, fmt.Sprintf("marks: want {stream, from >= 0}: %v", err))
	}
	var m wire.Marks
	var err error
	select {
	case <-s.done:
		m, err = sessiondir.MarksFromDisk(s.dir, req.Stream, req.From)
	default:
		m, err = sessiondir.ToWireMarks(req.Stream)(s.jw.Load().Marks(req.Stream, req.From, wire.MaxMarks))
		if errors.Is(err, journal.ErrFinished) || errors.Is(err, journal.ErrClosed) {
			<-s.done
			m, err = sessiondir.MarksFromDisk(s.dir, req.Stream, req.From)
		}
	}
	if err != nil {
		code := proto.CodeProvider
		if errors.Is(err, journal.ErrUnknownStream) {
			code = proto.CodeInvalid
		}
		return proto.StError, proto.ErrorBody(code, err.Error())
	}
	b, _ := json.Marshal(m)
	return proto.StOK, b
}
