package daemon

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/journal"
	"github.com/agentrunner/runner/shim"
	"github.com/agentrunner/runner/wire"
)

// Attach tuning. Memory per attach is bounded by (chunkQueue+streams+1) ×
// chunkSize (queued chunks, one being read per stream, one frame being
// written): a slow client holds at most that much (320 KiB), and its
// readers simply stop reading the journal until it catches up. 64 KiB
// frames halve the per-frame cost (a WebSocket write, a client message)
// per byte against 32 KiB; measured by BenchmarkAttachReplay in bench/.
const (
	chunkSize       = 64 << 10
	chunkQueue      = 2
	heartbeatEvery  = 15 * time.Second
	pingEvery       = 20 * time.Second
	pingTimeout     = 20 * time.Second
	slowClientLimit = 60 * time.Second
)

// chunk is what a stream pump hands to the attach writer: data at off, or
// the end of the stream (err is io.EOF, journal.ErrLost, or a failure).
type chunk struct {
	stream string
	off    int64
	data   []byte
	buf    *[]byte // data's buffer, for chunkPool; nil with err
	err    error
}

// chunkPool holds chunkSize read buffers shared by every attach.
var chunkPool = sync.Pool{New: func() any { b := make([]byte, chunkSize); return &b }}

// pump reads one stream from rd and sends chunks to out until the stream
// ends or ctx is done. It always sends a final chunk with err set unless
// ctx ended first.
//
// Each data chunk's buffer comes from chunkPool; the receiver puts it back
// once the bytes are copied into a frame, so a steady attach allocates no
// buffer per frame.
func pump(ctx context.Context, stream string, rd *journal.Reader, out chan<- chunk) {
	for {
		bp := chunkPool.Get().(*[]byte)
		off := rd.Offset()
		n, err := rd.ReadContext(ctx, *bp)
		if n > 0 {
			select {
			case out <- chunk{stream: stream, off: off, data: (*bp)[:n], buf: bp}:
			case <-ctx.Done():
				return
			}
		} else {
			chunkPool.Put(bp)
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			select {
			case out <- chunk{stream: stream, err: err}:
			case <-ctx.Done():
			}
			return
		}
	}
}

func (s *server) attachReaders(w http.ResponseWriter, r *http.Request, ss registry.Session, j *journal.Journal) (map[string]*journal.Reader, error) {
	readers := map[string]*journal.Reader{}
	closeAll := func() {
		for _, rd := range readers {
			rd.Close()
		}
	}
	for _, stream := range streamsOf(ss.Request.TTY) {
		cursor, err := parseCursor(r, stream)
		if err != nil {
			closeAll()
			return nil, err
		}
		rd, err := s.openReader(j, stream, cursor, true)
		if err != nil {
			closeAll()
			return nil, err
		}
		readers[stream] = rd
	}
	if ss.Request.TTY {
		if c, err := parseCursor(r, "stderr"); err != nil || c != 0 {
			closeAll()
			return nil, errInvalid("a tty session has no stderr stream")
		}
	}
	return readers, nil
}

func (s *server) handleAttach(w http.ResponseWriter, r *http.Request) {
	if s.refuseWithoutDescriptors(w, r) { // descriptors.go; before the upgrade
		return
	}
	ss, err := s.session(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	j, err := s.openJournal(ss)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer j.Close()
	readers, err := s.attachReaders(w, r, ss, j)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer func() {
		for _, rd := range readers {
			rd.Close()
		}
	}()
	done, ok := s.track()
	if !ok {
		s.writeError(w, r, errUnavailable("runnerd is stopping"))
		return
	}
	defer done()

	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		return // Accept wrote the HTTP error
	}
	defer conn.CloseNow()
	conn.SetReadLimit(64 << 10)
	s.metrics.attaches.Add(1)
	s.metrics.attachesTotal.Add(1)
	defer s.metrics.attaches.Add(-1)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait() // after cancel (deferred below) so every goroutine has ended
	defer cancel()

	// Discard what the client sends; reading also answers pings and
	// notices the close handshake or a dead connection.
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer cancel()
		for {
			_, rd, err := conn.Reader(ctx)
			if err != nil {
				return
			}
			if _, err := io.Copy(io.Discard, rd); err != nil {
				return
			}
		}
	}()
	// Ping so a peer that vanished without a FIN is noticed.
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(pingEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				pctx, pcancel := context.WithTimeout(ctx, pingTimeout)
				err := conn.Ping(pctx)
				pcancel()
				if err != nil {
					cancel()
					return
				}
			}
		}
	}()
	ch := make(chan chunk, chunkQueue)
	for stream, rd := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pump(ctx, stream, rd, ch)
		}()
	}

	// A write that does not complete within slowClientLimit drops the
	// client: one watchdog timer for the whole attach, armed around each
	// write, instead of a context with a deadline per frame.
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	watchdog := time.AfterFunc(slowClientLimit, wcancel)
	defer watchdog.Stop()
	watchdog.Stop()
	frame := make([]byte, 0, wire.FrameHeaderLen+chunkSize)
	write := func(b []byte) bool {
		watchdog.Reset(slowClientLimit)
		err := conn.Write(wctx, websocket.MessageBinary, b)
		watchdog.Stop()
		return err == nil
	}
	heartbeat := time.NewTimer(heartbeatEvery)
	defer heartbeat.Stop()
	open := len(readers)
	lost := false
	for open > 0 {
		select {
		case <-ctx.Done():
			return
		case <-s.stop:
			conn.Close(websocket.StatusGoingAway, "runnerd is stopping")
			return
		case <-heartbeat.C:
			if !write(wire.AppendHeartbeat(frame[:0])) {
				return
			}
			heartbeat.Reset(heartbeatEvery)
		case c := <-ch:
			if c.err == nil {
				id, _ := wire.StreamByName(c.stream)
				frame, err = wire.AppendData(frame[:0], id, c.off, c.data)
				chunkPool.Put(c.buf)
				if err != nil || !write(frame) {
					return
				}
				heartbeat.Reset(heartbeatEvery)
				continue
			}
			switch {
			case errors.Is(c.err, io.EOF):
				open--
			case errors.Is(c.err, journal.ErrLost):
				open--
				lost = true
			default:
				ae := classify(c.err)
				s.log.Warn("attach stream failed", "sandbox", ss.Sandbox, "session", ss.ID, "stream", c.stream, "err", c.err)
				frame, _ = wire.AppendError(frame[:0], wire.Error{Code: ae.code, Detail: ae.detail})
				if write(frame) {
					conn.Close(websocket.StatusNormalClosure, "")
				}
				return
			}
		}
	}
	// Every stream has ended: the terminal frame.
	exit, err := s.finalExit(ss, j, lost)
	switch {
	case err != nil:
		ae := classify(err)
		frame, _ = wire.AppendError(frame[:0], wire.Error{Code: ae.code, Detail: ae.detail})
	case exit.Reason == wire.ExitLost:
		frame, _ = wire.AppendLost(frame[:0], exit)
	default:
		frame, _ = wire.AppendExit(frame[:0], exit)
	}
	if write(frame) {
		conn.Close(websocket.StatusNormalClosure, "")
	}
}

// finalExit returns the exit record of a session whose streams have all
// been read to their end. lost says a reader saw the writer gone without
// an exit record; the journal is then finished as lost (if nobody did it
// yet) so every reader and the registry agree.
func (s *server) finalExit(ss registry.Session, j *journal.Journal, lost bool) (wire.Exit, error) {
	e, ok, err := j.Exit()
	if err != nil {
		return wire.Exit{}, errUnavailable("read exit record: %v", err)
	}
	if !ok {
		if !lost {
			return wire.Exit{}, errUnavailable("streams ended without an exit record")
		}
		e, err = finishLost(s.sessionDir(ss), "session supervisor died without an exit record")
		if err != nil {
			return wire.Exit{}, err
		}
	}
	exit := shim.WireExit(e)
	if ss.State == wire.SessionRunning || ss.State == stateStarting {
		s.recordExitLater(ss, exit)
	}
	return exit, nil
}
