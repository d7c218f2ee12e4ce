package spritestest

import (
	"context"
	"encoding/json"
	"io"
	"sync"
	"syscall"
	"time"

	"github.com/coder/websocket"
)

// The output path of an exec: pumps, the fast-command buffer
// (Options.LoseOutput), the JSON exit message at the reap, the exit frame
// and the close hold.

// run starts the command's pumps and its waiter, owned by s.wg.
func (s *Server) run(p *proc) {
	// Every Add happens under mu after a look at closing, so none races
	// shutdown's Wait; a command that lost that race is killed and reaped
	// here.
	s.mu.Lock()
	select {
	case <-s.closing:
		s.mu.Unlock()
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
		_ = p.cmd.Wait()
		return
	default:
	}
	var pw sync.WaitGroup
	for _, f := range p.pumps {
		pw.Add(1)
		s.wg.Add(1)
		go func() { defer s.wg.Done(); defer pw.Done(); f() }()
	}
	if p.buffering {
		// A command still running after FastCommand is not fast: what it
		// wrote so far goes out, and the rest live.
		p.flush = time.AfterFunc(s.opts.FastCommand, func() { s.flushPending(p) })
	}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		// Reaped with Process.Wait, not Cmd.Wait (which would close the
		// pipes under the pumps): the JSON exit message of a non-TTY exec
		// goes out at the reap, before the output still in the pipes.
		st, _ := p.cmd.Process.Wait()
		if st != nil {
			p.ws, _ = st.Sys().(syscall.WaitStatus)
		}
		s.mu.Lock()
		p.dropExit = p.cut
		switch s.dropExit {
		case DropExitAlways:
			p.dropExit = true
		case DropExitRandom:
			p.dropExit = p.dropExit || time.Since(p.started) < s.opts.FastCommand && s.rng.Float64() < s.opts.DropRate
		}
		text := !p.tty && !p.dropExit && !s.opts.NoTextExit
		s.mu.Unlock()
		close(p.reaped)
		if text {
			s.sendTextExit(p)
		}
		close(p.textSent)
		// Drain the output to EOF before the exit frame, so it follows
		// every byte.
		pw.Wait()
		for _, c := range p.closers {
			c.Close()
		}
		if p.master != nil {
			p.master.Close()
		}
		s.finish(p)
	}()
}

// textLag is how long an output chunk of a non-TTY exec waits for its
// command's reap, so the JSON exit message of a command that exits right
// after writing (runner-shim's one-shot calls) reliably comes first, as
// the field capture saw.
const textLag = 30 * time.Millisecond

// pump copies one output stream to the attached client; output while
// detached is dropped. sid < 0 sends raw bytes (TTY).
func (s *Server) pump(p *proc, r io.Reader, sid int) {
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if sid >= 0 && !s.opts.NoTextExit {
				t := time.NewTimer(textLag)
				select {
				case <-p.reaped:
					<-p.textSent
				case <-t.C:
				}
				t.Stop()
			}
			s.deliver(p, chunk{sid: sid, data: append([]byte(nil), buf[:n]...)})
		}
		if err != nil {
			return
		}
	}
}

// deliver sends one chunk, holds it while the command may be fast, or
// drops it (detached, cut).
func (s *Server) deliver(p *proc, c chunk) {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	s.mu.Lock()
	conn, cut := p.conn, p.cut
	if p.buffering {
		p.pending = append(p.pending, c)
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	if conn != nil && !cut {
		_ = conn.Write(context.Background(), websocket.MessageBinary, c.msg())
	}
}

// flushPending ends the buffering of a command that is not fast.
func (s *Server) flushPending(p *proc) {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	s.mu.Lock()
	if !p.buffering {
		s.mu.Unlock()
		return
	}
	p.buffering = false
	pending, conn, cut := p.pending, p.conn, p.cut
	p.pending = nil
	s.mu.Unlock()
	if conn == nil || cut {
		return
	}
	for _, c := range pending {
		_ = conn.Write(context.Background(), websocket.MessageBinary, c.msg())
	}
}

// The fates of a fast command's output under Options.LoseOutput.
const (
	fateKept     = iota // sent as written
	fateLost            // none of it (sprites-py #16)
	fateReplayed        // stderr merged into stdout, capped at ReplayCap
)

func (s *Server) sendTextExit(p *proc) {
	s.mu.Lock()
	conn := p.conn
	s.mu.Unlock()
	if conn == nil {
		return
	}
	b, _ := json.Marshal(map[string]any{"type": "exit", "exit_code": exitCode(p.ws)})
	_ = conn.Write(context.Background(), websocket.MessageText, b)
}

func exitCode(ws syscall.WaitStatus) int {
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// finish records the exit and, when a client is attached, sends what a
// fast command kept of its output, then the exit (ONE byte in a stream 3
// frame, or the JSON exit message with a TTY), holds the socket
// CloseHold and closes it with status 1000 — or, when the quirk strikes,
// closes with 1000 and no exit at all.
func (s *Server) finish(p *proc) {
	code := exitCode(p.ws)
	p.wmu.Lock()
	defer p.wmu.Unlock()
	s.mu.Lock()
	p.exited, p.code = true, code
	close(p.done)
	if p.timer != nil {
		p.timer.Stop()
	}
	if p.flush != nil {
		p.flush.Stop()
	}
	conn := p.conn
	p.conn = nil
	drop := p.dropExit
	var pending []chunk
	fate := fateKept
	if p.buffering {
		p.buffering = false
		pending, p.pending = p.pending, nil
		switch {
		case s.opts.ReplayFast:
			fate = fateReplayed
		case s.dropExit == DropExitRandom && s.rng.Float64() < s.opts.DropRate*2:
			fate = fateLost + s.rng.IntN(2)
		}
	}
	if drop && conn != nil {
		s.dropped++
	}
	if fate != fateKept && conn != nil {
		s.lostOutput++
	}
	s.mu.Unlock()
	if conn == nil {
		return
	}
	ctx := context.Background()
	if !p.cut {
		switch fate {
		case fateKept:
			for _, c := range pending {
				_ = conn.Write(ctx, websocket.MessageBinary, c.msg())
			}
		case fateReplayed:
			var merged []byte
			for _, c := range pending {
				merged = append(merged, c.data...)
			}
			merged = merged[:min(len(merged), ReplayCap)]
			if len(merged) > 0 {
				_ = conn.Write(ctx, websocket.MessageBinary, append([]byte{sidStdout}, merged...))
			}
		}
	}
	s.sendExit(ctx, conn, p.hold, p.tty, code, drop)
}

func (s *Server) sendExit(ctx context.Context, conn *websocket.Conn, hold *holdConn, tty bool, code int, drop bool) {
	if !drop {
		if hold != nil {
			hold.arm(s.opts.CloseHold)
		}
		if tty {
			b, _ := json.Marshal(map[string]any{"type": "exit", "exit_code": code})
			_ = conn.Write(ctx, websocket.MessageText, b)
		} else {
			// One byte: the protocol has no room for more.
			_ = conn.Write(ctx, websocket.MessageBinary, []byte{sidExit, byte(code)})
		}
		// The server's own close waits out the hold too (sleeping here
		// rather than in the write: coder/websocket bounds a close
		// frame's write by 5 s).
		if s.opts.CloseHold > 0 {
			t := time.NewTimer(s.opts.CloseHold)
			select {
			case <-t.C:
			case <-s.closing:
				t.Stop()
			}
		}
	}
	_ = conn.Close(websocket.StatusNormalClosure, "")
}
