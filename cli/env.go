package cli

// What a command runs with: the global flags, stdio, and the client of the
// runnerd it found (flags, then environment, then the state directory).

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/client"
)

// stdio is where a command reads and writes. Terminal handling (attach)
// needs real files.
type stdio struct {
	in       *os.File
	out, err *os.File
}

// stateDir is the state directory runner found runnerd by ("" when
// --url and a token named it): where it looks whether runnerd is
// starting.
var stateDir string

// daemonStarting reports whether the runnerd of stateDir is starting
// (client.Starting): a refused connection then means "wait", not "is it
// running?".
func daemonStarting() (int, bool) {
	if stateDir == "" {
		return 0, false
	}
	return client.Starting(stateDir)
}

// reconnectGiveUp reports whether a reconnect that began at lostAt
// has waited long enough: reconnectFor, and longer while runnerd says
// it is starting (a restart that recovers many sessions), up to
// startingFor.
func reconnectGiveUp(lostAt time.Time) bool {
	waited := time.Since(lostAt)
	if waited <= reconnectFor {
		return false
	}
	_, starting := daemonStarting()
	return !starting || waited > startingFor
}

// startingFor bounds the wait for a runnerd that says it is starting.
const startingFor = 10 * time.Minute

// globals are the flags every command accepts.
type globals struct {
	url       string
	tokenFile string
	timeout   time.Duration
	json      bool
	tls       client.TLSFiles // --ca, --cert, --key over RUNNERD_CA, RUNNERD_CLIENT_CERT, RUNNERD_CLIENT_KEY
}

func (g *globals) register(fs *flag.FlagSet) {
	fs.StringVar(&g.url, "url", "", "runnerd endpoint: http://HOST:PORT or unix:///path/runnerd.sock (default $RUNNERD_URL, else found on its own)")
	fs.StringVar(&g.tokenFile, "token-file", "", "file holding the bearer token (without it: the token itself from $RUNNERD_TOKEN, else the file STATE/token)")
	fs.DurationVar(&g.timeout, "timeout", client.DefaultRequestTimeout, "deadline of each call to runnerd (exec, attach and logs -f wait for the command instead)")
	fs.StringVar(&g.tls.CA, "ca", "", "PEM file of the CA that signed runnerd's certificate, for an https:// endpoint (default $RUNNERD_CA, else the host's roots)")
	fs.StringVar(&g.tls.Cert, "cert", "", "PEM client certificate for a runnerd with --tls-client-ca (default $RUNNERD_CLIENT_CERT)")
	fs.StringVar(&g.tls.Key, "key", "", "PEM key of --cert (default $RUNNERD_CLIENT_KEY)")
	fs.BoolVar(&g.json, "json", false, "print JSON for scripts: every command that prints something, and errors (one object on stderr)")
}

// env is what a command runs with: the parsed globals, stdio, and a lazily
// made client.
type env struct {
	g   globals
	io  stdio
	cli *client.Client
	// where is the endpoint (and state directory) the client was made
	// for, for messages.
	where string
}

// client resolves the daemon's endpoint and token: flags, then environment,
// then client.Discover (the state directory runnerd uses by default).
func (e *env) client() (*client.Client, error) {
	if e.cli != nil {
		return e.cli, nil
	}
	endpoint := e.g.url
	if endpoint == "" {
		endpoint = os.Getenv(client.EnvURL)
	}
	endpoint = normalizeEndpoint(endpoint)
	token := os.Getenv(client.EnvToken)
	if e.g.tokenFile != "" {
		b, err := os.ReadFile(e.g.tokenFile)
		if err != nil {
			return nil, &exitError{code: exitUsage, kind: "usage", msg: fmt.Sprintf("runner: read --token-file: %v", err)}
		}
		token = strings.TrimSpace(string(b))
		if token == "" {
			return nil, &exitError{code: exitUsage, kind: "usage", msg: fmt.Sprintf("runner: read --token-file: %s is empty", e.g.tokenFile)}
		}
	}
	if endpoint == "" || token == "" {
		// Look only for what the flags and environment did not give.
		l, err := client.DiscoverFor(endpoint, token)
		var starting *client.StartingError
		if errors.As(err, &starting) {
			stateDir = starting.Dir
			return nil, &cliError{what: "find runnerd", err: &adapter.UnavailableError{Detail: err.Error()},
				hint: startingHint(starting.PID), code: exitUnavailable}
		}
		var denied *client.StateDeniedError
		if errors.As(err, &denied) {
			hint := fmt.Sprintf("runnerd's state (%s) is another user's: run runner as that user, or use --token-file with a copy of its token", denied.Dir)
			if denied.UID == 0 {
				hint = fmt.Sprintf("runnerd runs as root and its state (%s) is root's: use sudo (sudo runner ...), or --token-file with a copy of its token", denied.Dir)
			}
			return nil, &cliError{what: "find runnerd", err: &adapter.DeniedError{Detail: err.Error()}, hint: hint}
		}
		if err != nil {
			return nil, &cliError{what: "find runnerd", err: &adapter.UnavailableError{Detail: err.Error()},
				hint: "is runnerd running? start it with `runnerd` (it writes its token into its state directory), or use --url and --token-file (RUNNERD_URL, RUNNERD_TOKEN)", code: exitUnavailable}
		}
		endpoint, token = l.Endpoint, l.Token()
		stateDir = l.StateDir
	}
	opts := client.Options{RequestTimeout: e.g.timeout, UserAgent: "runner-cli"}
	files := client.TLSFromEnv()
	if e.g.tls.CA != "" {
		files.CA = e.g.tls.CA
	}
	if e.g.tls.Cert != "" || e.g.tls.Key != "" {
		files.Cert, files.Key = e.g.tls.Cert, e.g.tls.Key
	}
	if err := files.Apply(&opts); err != nil {
		return nil, usagef("", "%v", err)
	}
	c, err := client.New(endpoint, token, opts)
	if err != nil {
		return nil, usagef("", "--url: %v", err)
	}
	e.cli = c
	e.where = endpoint
	return c, nil
}

// normalizeEndpoint accepts HOST:PORT and /path/to.sock as shorthands.
func normalizeEndpoint(s string) string {
	switch {
	case s == "":
		return ""
	case strings.HasPrefix(s, "/"):
		return "unix://" + s
	case !strings.Contains(s, "://"):
		return "http://" + s
	}
	return s
}

// callCtx bounds one short call. The client applies --timeout per request
// too; this bounds a command that makes several.
func (e *env) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, e.g.timeout+5*time.Second)
}

// withClient is the body of a command that needs nothing checked before
// it reaches runnerd: body gets the client and a context that bounds the
// command's short calls (callCtx).
func withClient(body func(ctx context.Context, e *env, c *client.Client, pos []string) error) func(context.Context, *env, []string, []string) error {
	return func(ctx context.Context, e *env, pos, _ []string) error {
		c, err := e.client()
		if err != nil {
			return err
		}
		ctx, cancel := e.callCtx(ctx)
		defer cancel()
		return body(ctx, e, c, pos)
	}
}
