package client_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/client"
)

// The common flow of a control plane: find the daemon, create a sandbox
// by name, run a command to completion, spawn a turn, talk to it, drop the
// stream, and rejoin it from the bytes already persisted.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	local, err := client.Discover() // $RUNNERD_URL/$RUNNERD_TOKEN, else runnerd's state dir
	if err != nil {
		log.Fatal(err)
	}
	c, err := local.New(client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	a, err := client.NewAdapter(ctx, c, client.AdapterOptions{})
	if err != nil {
		log.Fatal(err)
	}

	h, err := a.Create(ctx, "example-agent", adapter.CreateOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer a.Destroy(ctx, h)

	res, err := a.Exec(ctx, h, adapter.Shell("echo oops; exit 3"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("exec: %q %v\n", res.Stdout, res.Exit)

	// A turn: spawn returns once the process runs, so stdin is not lost.
	st, err := a.Spawn(ctx, h, adapter.Shell("echo ready; cat"), adapter.SpawnOptions{SessionID: "turn-1"})
	if err != nil {
		log.Fatal(err)
	}
	var cur adapter.Cursor
	f := <-st.Frames() // "ready\n"
	cur.Advance(f)     // persist the cursor with the bytes
	st.Close()         // detach: the turn keeps running

	if err := a.WriteStdin(ctx, h, "turn-1", []byte("hello\n")); err != nil {
		log.Fatal(err)
	}
	if err := a.CloseStdin(ctx, h, "turn-1"); err != nil {
		log.Fatal(err)
	}
	// Rejoin from the cursor: no byte twice, none lost.
	st, err = a.Attach(ctx, h, "turn-1", cur)
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	for f := range st.Frames() {
		switch {
		case f.Exit != nil:
			fmt.Println("turn:", *f.Exit)
		case f.Err != nil:
			fmt.Println("transport broke, attach again from", cur, f.Err)
		default:
			fmt.Printf("turn %s@%d: %q\n", f.Stream, f.Offset, f.Data)
			cur.Advance(f)
		}
	}
	// Output:
	// exec: "oops\n" exited (code 3)
	// turn stdout@6: "hello\n"
	// turn: exited (code 0)
}
