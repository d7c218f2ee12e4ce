package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/agentrunner/runner/wire"
)

// Environment variables Discover reads. RUNNERD_STATE, RUNNERD_TOKEN and
// RUNNERD_LISTEN are the daemon's own (cmd/runnerd --help), so a shell set
// up for runnerd finds it; RUNNERD_URL is the client's.
const (
	EnvURL    = "RUNNERD_URL"    // endpoint: http://host:port or unix:///path
	EnvToken  = "RUNNERD_TOKEN"  // bearer token, overrides STATE/token
	EnvState  = "RUNNERD_STATE"  // state directory
	EnvListen = "RUNNERD_LISTEN" // the daemon's TCP address
)

// DefaultEndpoint is runnerd's default TCP address as an endpoint.
// Discover never falls back to it: another runnerd may listen there.
const DefaultEndpoint = "http://127.0.0.1:7323"

// Local is where the local daemon is, as [Discover] found it. Its token
// never prints: %v of a Local shows the endpoint and the state directory.
type Local struct {
	// Endpoint is the daemon's endpoint for [New].
	Endpoint string
	// StateDir is the state directory the token was read from ("" when
	// both RUNNERD_URL and RUNNERD_TOKEN were set).
	StateDir string
	// TLS is the client's TLS material from $RUNNERD_CA,
	// $RUNNERD_CLIENT_CERT and $RUNNERD_CLIENT_KEY (tls.go); New loads it.
	TLS   TLSFiles
	token secret
}

// Token returns the bearer token, for [New].
func (l Local) Token() string { return string(l.token) }

// String returns the endpoint and state directory, never the token.
func (l Local) String() string {
	return fmt.Sprintf("runnerd at %s (state %s)", l.Endpoint, l.StateDir)
}

// Format prints String under every verb.
func (l Local) Format(f fmt.State, verb rune) { _, _ = io.WriteString(f, l.String()) }

// New returns a Client for the discovered daemon, with l.TLS loaded into
// opts (a root pool or certificate already in opts is replaced only by a
// file l.TLS names).
func (l Local) New(opts Options) (*Client, error) {
	if err := l.TLS.Apply(&opts); err != nil {
		return nil, err
	}
	return New(l.Endpoint, string(l.token), opts)
}

// StateDirs returns the state directories runnerd would use, in its order
// of preference (daemon.DefaultStateDir, plus the systemd unit's
// /var/lib/runnerd): $STATE_DIRECTORY (its first entry), $RUNNERD_STATE,
// $XDG_STATE_HOME/runnerd, ~/.local/state/runnerd, /var/lib/runnerd.
func StateDirs() []string {
	var dirs []string
	if d := os.Getenv("STATE_DIRECTORY"); d != "" {
		d, _, _ = strings.Cut(d, ":")
		dirs = append(dirs, d)
	}
	if d := os.Getenv(EnvState); d != "" {
		dirs = append(dirs, d)
	}
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		dirs = append(dirs, filepath.Join(d, "runnerd"))
	}
	if home, err := os.UserHomeDir(); err == nil {
		dirs = append(dirs, filepath.Join(home, ".local", "state", "runnerd"))
	}
	return append(dirs, "/var/lib/runnerd")
}

// Discover finds the local daemon the way runnerd picks its defaults:
//
//   - the endpoint is $RUNNERD_URL; else what STATE/listen.json (written by
//     the running daemon, wire.ListenFile) says: its unix socket when that
//     exists, else its TCP address; else the unix socket STATE/runnerd.sock
//     when it exists (a daemon that predates listen.json); else
//     http://$RUNNERD_LISTEN when set. It never guesses an address: with
//     none of these it returns an error (the daemon is not running, or
//     runs elsewhere).
//   - the token is $RUNNERD_TOKEN; else the content of STATE/token.
//   - the TLS material (for an https endpoint, which listen.json names
//     when runnerd has --tls-cert) is what $RUNNERD_CA,
//     $RUNNERD_CLIENT_CERT and $RUNNERD_CLIENT_KEY name.
//   - STATE is the first of [StateDirs] that holds a token file, a listen
//     file or a socket.
//
// It returns an error naming the places it looked when it finds no token.
func Discover() (Local, error) { return DiscoverFor("", "") }

// DiscoverFor is [Discover] for a caller that already has the endpoint or
// the token (from its own flags): a non-empty endpoint or token is used as
// is, ahead of the environment, and only what is missing is looked for in
// the state directory. A known endpoint needs no listen file, and a known
// token needs no readable STATE/token.
func DiscoverFor(endpoint, token string) (Local, error) {
	url, tok := endpoint, token
	if url == "" {
		url = os.Getenv(EnvURL)
	}
	if tok == "" {
		tok = os.Getenv(EnvToken)
	}
	if url != "" && tok != "" {
		return Local{Endpoint: url, TLS: TLSFromEnv(), token: secret(tok)}, nil
	}
	var state, denied string
	for _, d := range StateDirs() {
		if exists(filepath.Join(d, "token")) || exists(filepath.Join(d, wire.ListenFile)) || exists(filepath.Join(d, "runnerd.sock")) || exists(filepath.Join(d, wire.StartingFile)) {
			state = d
			break
		}
		if _, err := os.Stat(filepath.Join(d, "token")); errors.Is(err, fs.ErrPermission) && denied == "" {
			denied = d
		}
	}
	if state == "" && denied != "" {
		return Local{}, stateDenied(denied)
	}
	if state == "" {
		return Local{}, fmt.Errorf("discover runnerd: no state directory with a token or socket among %s; set %s and %s",
			strings.Join(StateDirs(), ", "), EnvURL, EnvToken)
	}
	l := Local{StateDir: state, Endpoint: url, TLS: TLSFromEnv()}
	if l.Endpoint == "" {
		ep, err := endpointIn(state)
		if err != nil {
			return l, err
		}
		l.Endpoint = ep
	}
	if tok != "" {
		l.token = secret(tok)
		return l, nil
	}
	b, err := os.ReadFile(filepath.Join(state, "token"))
	if err != nil {
		if errors.Is(err, fs.ErrPermission) {
			return l, stateDenied(state)
		}
		return l, fmt.Errorf("discover runnerd: read token: %w", err)
	}
	t := strings.TrimSpace(string(b))
	if t == "" {
		return l, fmt.Errorf("discover runnerd: token file in %s is empty", state)
	}
	l.token = secret(t)
	return l, nil
}

// endpointIn returns the endpoint of the daemon of state, from what tells
// it: the listen file, a socket, or $RUNNERD_LISTEN.
func endpointIn(state string) (string, error) {
	if pid, ok := Starting(state); ok {
		return "", &StartingError{Dir: state, PID: pid}
	}
	b, err := os.ReadFile(filepath.Join(state, wire.ListenFile))
	switch {
	case err == nil:
		var ln wire.Listen
		if err := json.Unmarshal(b, &ln); err != nil {
			return "", fmt.Errorf("discover runnerd: decode %s: %w", filepath.Join(state, wire.ListenFile), err)
		}
		if ln.Socket != "" && exists(ln.Socket) {
			return "unix://" + ln.Socket, nil
		}
		if ln.TCP != "" && ln.TLS {
			return "https://" + ln.TCP, nil
		}
		if ln.TCP != "" {
			return "http://" + ln.TCP, nil
		}
		return "", fmt.Errorf("discover runnerd: %s names no address that exists", filepath.Join(state, wire.ListenFile))
	case errors.Is(err, fs.ErrPermission):
		return "", stateDenied(state)
	case !errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("discover runnerd: read listen file: %w", err)
	}
	if sock := filepath.Join(state, "runnerd.sock"); exists(sock) {
		return "unix://" + sock, nil
	}
	if v := os.Getenv(EnvListen); v != "" && v != "none" {
		return "http://" + v, nil
	}
	return "", fmt.Errorf("discover runnerd: nothing in %s says where runnerd listens (no %s, no runnerd.sock; is it running?); set %s",
		state, wire.ListenFile, EnvURL)
}

// StartingError is Discover's error while the runnerd of Dir is
// starting (wire.StartingFile names a live process): it serves in a
// moment; it is not stopped.
type StartingError struct {
	Dir string
	PID int
}

func (e *StartingError) Error() string {
	return fmt.Sprintf("discover runnerd: runnerd (pid %d) is starting in %s and does not serve yet", e.PID, e.Dir)
}

// Starting reports whether the runnerd of state directory dir is
// starting: its wire.StartingFile is there and names a process that
// lives. A start that died leaves the file naming no process: that is
// not starting.
func Starting(dir string) (pid int, ok bool) {
	b, err := os.ReadFile(filepath.Join(dir, wire.StartingFile))
	if err != nil {
		return 0, false
	}
	var st wire.Starting
	if json.Unmarshal(b, &st) != nil || st.PID <= 0 {
		return 0, false
	}
	if err := syscall.Kill(st.PID, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return 0, false
	}
	return st.PID, true
}

// StateDeniedError is Discover's error when a state directory runnerd
// uses is there but this user may not read it: runnerd runs as another
// user (root, as a system service), whose token this one cannot read.
// It is not "runnerd is not running".
type StateDeniedError struct {
	// Dir is the state directory.
	Dir string
	// UID owns Dir (-1 when its owner could not be read).
	UID int
}

func (e *StateDeniedError) Error() string {
	owner := "another user's"
	switch {
	case e.UID == 0:
		owner = "root's"
	case e.UID > 0:
		owner = fmt.Sprintf("uid %d's", e.UID)
	}
	return fmt.Sprintf("discover runnerd: its state %s is %s: permission denied (run as that user, or set %s)", e.Dir, owner, EnvToken)
}

// stateDenied is the StateDeniedError of dir, with its owner.
func stateDenied(dir string) error {
	e := &StateDeniedError{Dir: dir, UID: -1}
	if st, err := os.Stat(dir); err == nil {
		if sys, ok := st.Sys().(*syscall.Stat_t); ok {
			e.UID = int(sys.Uid)
		}
	} else if st, err := os.Stat(filepath.Dir(dir)); err == nil {
		// dir itself is behind a directory this user cannot enter:
		// that directory's owner is the one to be.
		if sys, ok := st.Sys().(*syscall.Stat_t); ok {
			e.UID = int(sys.Uid)
		}
	}
	return e
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
