package daemon

// The shim check Run makes before it serves anything: the shim command
// must be an executable and, when runnerd knows its own version, answer
// --version with it.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"strings"
	"time"
)

// ErrShimUnusable is returned by Run, before it serves anything, when the
// shim it would start every session with cannot run: a runnerd that
// answered /healthz but failed every spawn would look healthy to a
// supervisor and to its operator.
var ErrShimUnusable = errors.New("the shim cannot run sessions")

// shimVersionTimeout bounds the shim's answer to --version.
const shimVersionTimeout = 10 * time.Second

// checkShim checks that argv[0] of the shim command is an executable file
// and, when want (runnerd's version) is set, that it is the same build: it
// must answer "--version" with want. A shim that does not understand
// --version (runner-shim before it had one) is accepted with a warning,
// since its existence and mode were shown. Errors wrap ErrShimUnusable and
// name the path and the fix.
func checkShim(ctx context.Context, argv []string, want string, log *slog.Logger) error {
	path := argv[0]
	fix := "install runner-shim from the same build as runnerd at that path (images/install.sh installs both), or start runnerd without --shim to use its built-in shim"
	if _, err := exec.LookPath(path); err != nil {
		return fmt.Errorf("%w: shim %s: %w; %s", ErrShimUnusable, path, errors.Unwrap(err), fix)
	}
	if want == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, shimVersionTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, "--version")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		// Exit status 2 is a usage error, what a flag parser answers to a
		// flag it does not know; anything else (a crash, a signal, a
		// timeout) is a shim that cannot run.
		if errors.As(err, &ee) && ee.ExitCode() == 2 && ctx.Err() == nil {
			log.Warn("cannot check the shim's version: it does not answer --version (a runner-shim built before it had one?)",
				"shim", path, "want", want, "exit", ee.ExitCode(), "stderr", firstLine(stderr.String()))
			return nil
		}
		return fmt.Errorf("%w: shim %s: run --version: %w; %s", ErrShimUnusable, path, err, fix)
	}
	got := strings.TrimSpace(string(out))
	// runnerd --version and runner-shim --version print the version, or
	// "runner-shim VERSION": the last word is the version.
	if f := strings.Fields(got); len(f) > 0 {
		got = f[len(f)-1]
	}
	if got != want {
		return fmt.Errorf("%w: shim %s is version %q, runnerd is %q; %s", ErrShimUnusable, path, got, want, fix)
	}
	return nil
}

// firstLine is s up to its first newline, trimmed: a usage error's
// message, without the usage text after it.
func firstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return line
}
