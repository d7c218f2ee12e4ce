package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"
)

// DefaultListen is the TCP address runnerd listens on when none is given.
const DefaultListen = "127.0.0.1:7323"

// Environment variables runnerd reads (cmd/runnerd documents them in --help).
const (
	EnvState  = "RUNNERD_STATE"
	EnvToken  = "RUNNERD_TOKEN"
	EnvListen = "RUNNERD_LISTEN"
	EnvSocket = "RUNNERD_SOCKET"
	// EnvPreviewListen and EnvPreviewURL configure the preview listener.
	EnvPreviewListen = "RUNNERD_PREVIEW_LISTEN"
	EnvPreviewURL    = "RUNNERD_PREVIEW_URL"
)

// Config is everything Run needs. The zero value plus a StateDir is a
// working configuration; Defaults fills the rest.
type Config struct {
	// StateDir holds registry.db, token, runnerd.sock, sandboxes/ and s/.
	StateDir string
	// Listen is the TCP address to serve on; "none" disables TCP.
	Listen string
	// Socket is the unix socket path to serve on; "none" disables it.
	Socket string
	// Token is the bearer token; empty means read STATE/token, generating
	// it on first start.
	Token string
	// ShimCommand is the argv prefix that runs the shim's main (shim.Main),
	// to which the shim appends its own arguments. Default: this executable
	// with the hidden "shim" subcommand.
	ShimCommand []string
	// TerminateGrace is the grace of the SIGTERM before SIGKILL when destroy
	// stops sessions. Suspend uses SuspendGrace.
	TerminateGrace time.Duration
	SuspendGrace   time.Duration
	// ShutdownTimeout bounds how long Run waits for in-flight requests when
	// its context ends. Attaches are closed at once (clients reattach).
	ShutdownTimeout time.Duration
	// PreviewListen is the address of the preview listener and
	// PreviewURLTemplate how its URLs look (package preview), e.g.
	// "http://{token}.localhost:7324/". Both empty: no preview listener,
	// public_url is not advertised.
	PreviewListen      string
	PreviewURLTemplate string
	// Version is reported by /healthz.
	Version string
	// Logger receives structured logs; nil means slog.Default().
	Logger *slog.Logger

	// TCPListener, when set, is served instead of listening on Listen (for
	// tests and socket activation). Run closes it.
	TCPListener net.Listener
	// Ready, when set, is called once every listener is serving, with the
	// TCP address (empty if TCP is disabled).
	Ready func(tcpAddr string)
}

// DefaultStateDir resolves the state directory the way the docs say:
// $STATE_DIRECTORY (systemd), else $RUNNERD_STATE, else
// $XDG_STATE_HOME/runnerd, else ~/.local/state/runnerd.
func DefaultStateDir() (string, error) {
	if d := os.Getenv("STATE_DIRECTORY"); d != "" {
		// systemd may pass several, colon-separated; the first is ours.
		if i := indexByte(d, ':'); i >= 0 {
			d = d[:i]
		}
		return d, nil
	}
	if d := os.Getenv(EnvState); d != "" {
		return d, nil
	}
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "runnerd"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("find state directory: %w", err)
	}
	return filepath.Join(home, ".local", "state", "runnerd"), nil
}

func indexByte(s string, c byte) int {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return i
		}
	}
	return -1
}

// withDefaults returns cfg with every unset field filled.
func (cfg Config) withDefaults() (Config, error) {
	if cfg.StateDir == "" {
		d, err := DefaultStateDir()
		if err != nil {
			return cfg, err
		}
		cfg.StateDir = d
	}
	abs, err := filepath.Abs(cfg.StateDir)
	if err != nil {
		return cfg, fmt.Errorf("resolve state directory: %w", err)
	}
	cfg.StateDir = abs
	if cfg.Listen == "" {
		cfg.Listen = DefaultListen
	}
	if cfg.Socket == "" {
		cfg.Socket = filepath.Join(cfg.StateDir, "runnerd.sock")
	}
	if len(cfg.ShimCommand) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return cfg, fmt.Errorf("find own executable for the shim: %w", err)
		}
		cfg.ShimCommand = []string{exe, "shim"}
	}
	if cfg.TerminateGrace <= 0 {
		cfg.TerminateGrace = 5 * time.Second
	}
	if cfg.SuspendGrace <= 0 {
		cfg.SuspendGrace = 10 * time.Second
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if (cfg.PreviewListen == "") != (cfg.PreviewURLTemplate == "") {
		return cfg, errors.New("config: the preview listener needs both an address and a URL template")
	}
	if cfg.Listen == "none" && cfg.Socket == "none" && cfg.TCPListener == nil {
		return cfg, errors.New("config: both listeners disabled")
	}
	return cfg, nil
}
