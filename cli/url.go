package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/wire"
)

// urlPollInterval is how often `runner url --wait` asks again. Each ask is
// one small request that runnerd answers from the kernel's socket table.
const urlPollInterval = 200 * time.Millisecond

// errNotYetListening marks a --wait that ran out: the URL exists, nothing
// listens on its port.
var errNotYetListening = errors.New("nothing listens yet")

// previewURLWait asks runnerd for the preview URL of port in sandbox and,
// with wait > 0, asks again until something listens on the port or wait
// has passed (then an unavailable error wrapping errNotYetListening:
// the server may still come; nothing is broken). Each ask is bounded by
// --timeout; asking again returns the same URL.
func previewURLWait(ctx context.Context, e *env, c *client.Client, sandbox string, port int, wait time.Duration) (wire.URL, error) {
	deadline := time.Now().Add(wait)
	for {
		cctx, cancel := e.callCtx(ctx)
		u, err := c.PreviewURL(cctx, sandbox, port)
		cancel()
		if err != nil {
			return wire.URL{}, err
		}
		if wait == 0 || u.Listening == nil || *u.Listening {
			return u, nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return wire.URL{}, fmt.Errorf("%w: %w", &adapter.UnavailableError{
				Detail: fmt.Sprintf("nothing listens on port %d in sandbox %s after --wait %s", port, sandbox, wait),
			}, errNotYetListening)
		}
		t := time.NewTimer(min(urlPollInterval, left))
		select {
		case <-ctx.Done():
			t.Stop()
			return wire.URL{}, ctx.Err()
		case <-t.C:
		}
	}
}

// notYetListening reports whether err is a --wait that ran out.
func notYetListening(err error) bool { return errors.Is(err, errNotYetListening) }

func init() {
	commands = append(commands,
		&command{name: "url", args: "NAME PORT [--wait DURATION]", min: 2, max: 2,
			short: "print a public preview URL that reaches PORT inside the sandbox",
			long: `The URL is a capability: whoever has it can open it, with no token. Asking again
for the same port returns the same URL; rm revokes it. Needs runnerd started
with --preview-listen and --preview-url (public_url in runner caps).

The server inside the sandbox may bind any of its addresses: 127.0.0.1, ::1,
0.0.0.0 or the sandbox's own. When nothing listens on PORT yet, the URL is
printed all the same, with a note on stderr: it starts working once something
listens. With --wait DURATION, runner waits (at most that long) until
something listens, then prints the URL; if nothing does in time it prints no
URL and exits 255 (unavailable).`,
			setup: urlCmd},
	)
}

func urlCmd(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
	wait := fs.Duration("wait", 0, "wait at most this long for something to listen on PORT before printing the URL (0: do not wait)")
	return func(ctx context.Context, e *env, pos, _ []string) error {
		port, err := strconv.Atoi(pos[1])
		if err != nil || port < 1 || port > 65535 {
			return usagef("url", "PORT %q: want a number in 1..65535", pos[1])
		}
		if *wait < 0 {
			return usagef("url", "--wait %s: want a duration of 0 or more", *wait)
		}
		c, err := e.client()
		if err != nil {
			return err
		}
		what := fmt.Sprintf("url %s %d", pos[0], port)
		u, err := previewURLWait(ctx, e, c, pos[0], port, *wait)
		if err != nil {
			ce := &cliError{what: what, err: err}
			switch _, kind := codeOf(err); {
			case kind == "not_supported":
				ce.hint = "this runnerd has no preview listener: start it with --preview-listen ADDR --preview-url 'http://{token}.localhost:PORT/'"
			case notYetListening(err):
				ce.hint = fmt.Sprintf("the URL starts working once something listens on port %d; run without --wait to print it now", port)
			}
			return ce
		}
		listening := u.Listening == nil || *u.Listening // an older runnerd answered only when something listened
		if e.g.json {
			return e.printJSON(wire.URL{URL: u.URL, Listening: &listening})
		}
		fmt.Fprintln(e.io.out, u.URL)
		if !listening {
			fmt.Fprintf(e.io.err, "runner: note: nothing listens on port %d in sandbox %s yet; the URL starts working once something does (wait for it with --wait DURATION)\n", port, pos[0])
		}
		return nil
	}
}
