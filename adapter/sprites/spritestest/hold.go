package spritestest

import (
	"context"
	"net"
	"sync"
	"time"
)

// holdListener wraps the stand-in's listener so each connection can hold
// back the server's WebSocket close frame: Sprites keeps an exec's socket
// about 5 s after the exit byte before it closes or answers a client's
// close handshake (sprites-py #24 and #26, sprites-js #16). coder/websocket
// answers a close frame from inside Read, so the hold is applied where the
// bytes leave: a close frame written while the hold is armed waits for it.
type holdListener struct {
	net.Listener
	closing <-chan struct{}
}

func (l holdListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &holdConn{Conn: c, closing: l.closing}, nil
}

// holdConn is one accepted connection. Its hold is armed by the exec
// handler just before it writes the exit.
type holdConn struct {
	net.Conn
	closing <-chan struct{}

	mu    sync.Mutex // guards until
	until time.Time  // close frames wait until then
}

// arm holds every close frame written in the next d.
func (c *holdConn) arm(d time.Duration) {
	c.mu.Lock()
	c.until = time.Now().Add(d)
	c.mu.Unlock()
}

// opClose is the first byte of an unfragmented close frame from the
// server (FIN set, opcode 8; a server's frames are not masked).
const opClose = 0x88

func (c *holdConn) Write(p []byte) (int, error) {
	if len(p) > 0 && p[0] == opClose {
		c.mu.Lock()
		wait := time.Until(c.until)
		c.mu.Unlock()
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-c.closing:
				t.Stop()
			}
		}
	}
	return c.Conn.Write(p)
}

type holdKey struct{}

// connContext puts the connection into each request's context so the
// exec handler finds its hold.
func connContext(ctx context.Context, c net.Conn) context.Context {
	if hc, ok := c.(*holdConn); ok {
		return context.WithValue(ctx, holdKey{}, hc)
	}
	return ctx
}

func holdOf(ctx context.Context) *holdConn {
	hc, _ := ctx.Value(holdKey{}).(*holdConn)
	return hc
}
