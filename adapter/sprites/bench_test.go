package sprites_test

import (
	"context"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter/hosted/hostedtest"
	"github.com/agentrunner/runner/adapter/sprites"
	"github.com/agentrunner/runner/adapter/sprites/spritestest"
	"github.com/coder/websocket"
)

// BenchmarkShimCall is one runner-shim call (Sessions: runner-shim list
// over the exec WebSocket) against the stand-in holding every exec's
// socket 5 s after its exit byte, as Sprites does. "after" is the
// adapter; "before" is the baseline of the client as it was, an exec
// read to its exit and then closed with coder/websocket's Close, which
// waits for the server's close answer (the 5 s the adapter used to pay
// on every call). Figures are for a quiet machine:
//
//	go test -run '^$' -bench BenchmarkShimCall -benchtime 5x ./adapter/sprites/
func BenchmarkShimCall(b *testing.B) {
	srv, c := standIn(b, spritestest.Options{CloseHold: 5 * time.Second})
	a := newAdapter(b, c, nil)
	ctx := context.Background()
	h := hostedtest.Create(b, ctx, a, "bench")
	b.Run("after", func(b *testing.B) {
		for b.Loop() {
			if _, err := a.Sessions(ctx, h); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("before", func(b *testing.B) {
		q := url.Values{"cmd": {sprites.DefaultShimPath, "--root", sprites.DefaultRoot, "--json", "list"}}
		hd := http.Header{}
		hd.Set("Authorization", "Bearer "+srv.Token)
		for b.Loop() {
			conn, _, err := websocket.Dial(ctx, srv.URL()+"/v1/sprites/bench/exec?"+q.Encode(), &websocket.DialOptions{HTTPHeader: hd})
			if err != nil {
				b.Fatal(err)
			}
			for {
				_, msg, err := conn.Read(ctx)
				if err != nil {
					break // a close without an exit frame
				}
				if len(msg) == 2 && msg[0] == sprites.StreamExit {
					break
				}
			}
			go func() { _, _, _ = conn.Read(ctx) }() // reads the close answer
			_ = conn.Close(websocket.StatusNormalClosure, "")
		}
	})
}
