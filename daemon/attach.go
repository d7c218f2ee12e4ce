package daemon

import (
	"context"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/agentrunner/runner/daemon/apierr"
	"github.com/agentrunner/runner/daemon/internal/every"
	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/daemon/sessions"
	"github.com/agentrunner/runner/journal"
	"github.com/agentrunner/runner/shim/sessiondir"
)

// Attach tuning. The frames come from sessiondir.EmitFrames: memory per attach
// is one 64 KiB buffer per stream plus one frame being written, so a slow
// client holds at most that much and its readers simply stop reading the
// journal until it catches up. The plain stream and exec bodies are read
// sessions.ChunkSize at a time.
const (
	heartbeatEvery  = 15 * time.Second
	pingEvery       = 20 * time.Second
	pingTimeout     = 20 * time.Second
	slowClientLimit = 60 * time.Second
	// stopWriteGrace bounds a frame write still in flight when runnerd
	// stops, before the 1001 close.
	stopWriteGrace = 2 * time.Second
)

func (s *server) attachReaders(w http.ResponseWriter, r *http.Request, ss registry.Session, j *journal.Journal) (map[string]*journal.Reader, error) {
	readers := map[string]*journal.Reader{}
	closeAll := func() {
		for _, rd := range readers {
			rd.Close()
		}
	}
	sr, err := s.newSinceResolver(r, ss)
	if err != nil {
		return nil, err
	}
	defer sr.Close()
	for _, stream := range sessions.StreamsOf(ss.Request.TTY) {
		cursor, err := sr.cursor(r.Context(), r, stream, stream)
		if err != nil {
			closeAll()
			return nil, err
		}
		rd, err := s.ssn.OpenReader(j, stream, cursor, true)
		if err != nil {
			closeAll()
			return nil, err
		}
		readers[stream] = rd
	}
	if ss.Request.TTY {
		if c, err := parseCursor(r, "stderr"); err != nil || c != 0 {
			closeAll()
			return nil, apierr.Invalid("a tty session has no stderr stream")
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
	j, err := s.ssn.OpenJournal(ss)
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
	done, ok := s.life.Track()
	if !ok {
		s.writeError(w, r, apierr.Unavailable("runnerd is stopping"))
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
	s.attach(conn, ss, j, readers)
}

// attach sends ss's frames from readers over conn until the session ends
// (close 1000), runnerd stops (close 1001) or the client goes.
func (s *server) attach(conn *websocket.Conn, ss registry.Session, j *journal.Journal, readers map[string]*journal.Reader) {
	// Two lifetimes. connCtx is the connection's: the reads, pings and
	// writes run under it, and it ends when the peer is gone or the
	// handler returns. ctx, below it, is the frames': runnerd stopping
	// ends it, so no further frame is sent, while the connection stays
	// up for the 1001 close frame. coder/websocket closes the TCP
	// connection at once when the context of a pending read or write
	// ends, so stopping must never end connCtx before conn.Close: that
	// was the 1006 (no close frame) a client saw when runnerd stopped.
	connCtx, connCancel := context.WithCancel(context.Background())
	ctx, cancel := context.WithCancel(connCtx)
	var wg sync.WaitGroup
	defer wg.Wait() // after the cancels (deferred below) so every goroutine has ended
	defer connCancel()
	defer cancel()
	// A write that does not complete within slowClientLimit drops the
	// client: one watchdog timer for the whole attach, armed around each
	// write, instead of a context with a deadline per frame.
	wctx, wcancel := context.WithCancel(connCtx)
	defer wcancel()
	watchdog := time.AfterFunc(slowClientLimit, wcancel)
	defer watchdog.Stop()
	watchdog.Stop()
	var stopping atomic.Bool
	wg.Add(3)
	go func() {
		defer wg.Done()
		s.attachStopping(ctx, connCtx, cancel, wcancel, &stopping)
	}()
	go func() {
		defer wg.Done()
		defer connCancel()
		discardReads(connCtx, conn)
	}()
	go func() {
		defer wg.Done()
		pingUntil(ctx, connCtx, conn, connCancel)
	}()

	write := func(b []byte) error {
		watchdog.Reset(slowClientLimit)
		err := conn.Write(wctx, websocket.MessageBinary, b)
		watchdog.Stop()
		return err
	}
	// The frames are sessiondir.EmitFrames's, the producer runner-shim's attach
	// uses too, so both paths end a session the same way.
	err := sessiondir.EmitFrames(ctx, sessiondir.FrameSource{
		Dir: s.ssn.Dir(ss), Journal: j, Readers: readers, Heartbeat: heartbeatEvery,
		Log: s.log.With("sandbox", ss.Sandbox, "session", ss.ID),
	}, write)
	switch {
	case err == nil:
		conn.Close(websocket.StatusNormalClosure, "")
	case stopping.Load():
		conn.Close(websocket.StatusGoingAway, "runnerd is stopping")
	}
}

// attachStopping ends an attach with 1001 instead of a frame when runnerd
// stops: it sets stopping and ends the frames (cancel). A frame write
// still in flight then gets stopWriteGrace, not slowClientLimit, so a
// slow client cannot hold up the stop. It returns when the frames end.
func (s *server) attachStopping(ctx, connCtx context.Context, cancel, wcancel context.CancelFunc, stopping *atomic.Bool) {
	select {
	case <-s.life.Done():
		stopping.Store(true)
		cancel()
		t := time.NewTimer(stopWriteGrace)
		defer t.Stop()
		select {
		case <-t.C:
			wcancel()
		case <-connCtx.Done():
		}
	case <-ctx.Done():
	}
}

// discardReads discards what the client sends until the connection
// ends; reading also answers pings and notices the close handshake or a
// dead connection.
func discardReads(connCtx context.Context, conn *websocket.Conn) {
	for {
		_, rd, err := conn.Reader(connCtx)
		if err != nil {
			return
		}
		if _, err := io.Copy(io.Discard, rd); err != nil {
			return
		}
	}
}

// pingUntil pings every pingEvery until ctx ends, so a peer that vanished
// without a FIN is noticed: a ping unanswered within pingTimeout ends the
// connection (connCancel).
func pingUntil(ctx, connCtx context.Context, conn *websocket.Conn, connCancel context.CancelFunc) {
	every.Until(ctx, pingEvery, func() bool {
		pctx, pcancel := context.WithTimeout(connCtx, pingTimeout)
		err := conn.Ping(pctx)
		pcancel()
		if err != nil {
			connCancel()
			return false
		}
		return true
	})
}
