package preview_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/netip"

	"github.com/agentrunner/runner/daemon/preview"
)

// The daemon's side of the wiring: a token per sandbox port in its registry,
// a Lookup over that registry, and a Server it closes on shutdown.
func Example() {
	tok, err := preview.NewToken()
	if err != nil {
		log.Fatal(err)
	}
	registry := map[string]preview.Target{
		tok: {Sandbox: "webapp", Addr: netip.MustParseAddrPort("127.0.0.1:3000")},
	}
	srv, err := preview.New(preview.Config{
		URLTemplate: "http://{token}.localhost:7324/",
		Lookup: func(ctx context.Context, token string) (preview.Target, error) {
			t, ok := registry[token]
			if !ok {
				return preview.Target{}, preview.ErrUnknownToken
			}
			return t, nil
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0") // 127.0.0.1:7324 in real use
	if err != nil {
		log.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()

	fmt.Println(len(srv.URL(tok)) == len("http://.localhost:7324/")+preview.TokenLen)

	srv.Close()
	fmt.Println(errors.Is(<-done, http.ErrServerClosed))
	// Output:
	// true
	// true
}
