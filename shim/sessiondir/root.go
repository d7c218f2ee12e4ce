package sessiondir

import "os"

// DefaultRoot is where runner-shim keeps session directories: the
// RUNNER_SHIM_ROOT environment variable if set; /var/lib/runner-shim for
// root; else $XDG_STATE_HOME/runner-shim (default ~/.local/state).
func DefaultRoot() string {
	if r := os.Getenv("RUNNER_SHIM_ROOT"); r != "" {
		return r
	}
	if os.Geteuid() == 0 {
		return "/var/lib/runner-shim"
	}
	if x := os.Getenv("XDG_STATE_HOME"); x != "" {
		return x + "/runner-shim"
	}
	home, _ := os.UserHomeDir()
	return home + "/.local/state/runner-shim"
}
