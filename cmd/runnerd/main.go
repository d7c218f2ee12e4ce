// Command runnerd is the runner daemon: it serves the HTTP+WebSocket API of
// docs/protocol.md and runs each session under a detached shim. This file is
// wiring only: flags and environment into daemon.Config, then daemon.Run.
//
// "runnerd shim ..." is the hidden per-session supervisor (shim.Main):
// runnerd re-executes itself that way, so one binary is the whole install.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/agentrunner/runner/daemon"
	"github.com/agentrunner/runner/shim"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

const usage = `runnerd: the runner daemon (docs/protocol.md, docs/operations.md)

Usage: runnerd [flags]

With no flags runnerd serves on 127.0.0.1:7323 and STATE/runnerd.sock, keeps
its state in the first of $STATE_DIRECTORY, $RUNNERD_STATE,
$XDG_STATE_HOME/runnerd, ~/.local/state/runnerd, and generates its bearer
token into STATE/token (mode 0600) on first start.

Flags:
`

const envHelp = `
Environment:
  STATE_DIRECTORY    set by systemd's StateDirectory=: the state directory
  RUNNERD_STATE      state directory when $STATE_DIRECTORY is unset (--state wins
                     over both)
  RUNNERD_LISTEN     TCP address, or "none" (flag --listen wins)
  RUNNERD_SOCKET     unix socket path, or "none" (flag --socket wins)
  RUNNERD_TOKEN      bearer token; overrides STATE/token (never pass it as a flag:
                     flags are visible in ps)
  RUNNERD_PREVIEW_LISTEN, RUNNERD_PREVIEW_URL
                     the preview listener (flags --preview-listen, --preview-url);
                     set both to advertise public_url
  RUNNERD_LOG_LEVEL  debug, info, warn, error (flag --log-level wins)
  NOTIFY_SOCKET      set by systemd (Type=notify): runnerd reports READY=1 there

Signals: SIGTERM and SIGINT stop serving gracefully. Running sessions are never
stopped: each runs under its own detached shim and is found again at the next start.
`

func main() {
	if len(os.Args) > 1 && os.Args[1] == "shim" {
		os.Exit(shim.Main(os.Args[2:]))
	}
	os.Exit(run(os.Args[1:]))
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func run(args []string) int {
	fs := flag.NewFlagSet("runnerd", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
		fmt.Fprint(fs.Output(), envHelp)
	}
	state := fs.String("state", "", "state directory (default: see above)")
	listen := fs.String("listen", envOr(daemon.EnvListen, daemon.DefaultListen), `TCP address to serve on, or "none"`)
	socket := fs.String("socket", envOr(daemon.EnvSocket, ""), `unix socket to serve on, or "none" (default STATE/runnerd.sock)`)
	previewListen := fs.String("preview-listen", envOr(daemon.EnvPreviewListen, ""), "address of the preview listener (public URLs); empty: none")
	previewURL := fs.String("preview-url", envOr(daemon.EnvPreviewURL, ""), `preview URL template, e.g. "http://{token}.localhost:7324/"`)
	logLevel := fs.String("log-level", envOr("RUNNERD_LOG_LEVEL", "info"), "log level: debug, info, warn, error")
	logJSON := fs.Bool("log-json", false, "log JSON lines instead of text")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "runnerd: unexpected argument %q (see runnerd --help)\n", fs.Arg(0))
		return 2
	}
	if *showVersion {
		fmt.Println(version)
		return 0
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(strings.ToUpper(*logLevel))); err != nil {
		fmt.Fprintf(os.Stderr, "runnerd: --log-level %q: %v\n", *logLevel, err)
		return 2
	}
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler = slog.NewTextHandler(os.Stderr, opts)
	if *logJSON {
		h = slog.NewJSONHandler(os.Stderr, opts)
	}
	log := slog.New(h)

	stateDir := *state
	if stateDir == "" {
		d, err := daemon.DefaultStateDir()
		if err != nil {
			log.Error("runnerd", "err", err)
			return 1
		}
		stateDir = d
	}
	cfg := daemon.Config{
		StateDir: stateDir,
		Listen:   *listen,
		Socket:   *socket,
		Token:    os.Getenv(daemon.EnvToken),
		Version:  version,

		PreviewListen:      *previewListen,
		PreviewURLTemplate: *previewURL,
		Logger:             log,
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := daemon.Run(ctx, cfg); err != nil {
		log.Error("runnerd", "err", err)
		return 1
	}
	return 0
}
