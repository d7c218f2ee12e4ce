// Package browsertest runs a real headless Chromium for tests: the
// browser that opens a preview URL with no credential (url-or-nothing).
// Each run gets a fresh, empty profile and home, and runs in a process
// group of its own that is killed as a group on timeout and once more
// after Chromium exits, for any helper it left behind.
package browsertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// Names are the binaries Find looks for, in order. Debian ships
// "chromium" (apt-get install chromium; .ci/run installs it).
var Names = []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"}

// Find returns the path of the first of Names on PATH, or "".
func Find() string {
	for _, name := range Names {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// DumpDOM opens url in headless Chromium (bin, as Find returned it) and
// returns the DOM after load and Chromium's stderr; err is its exit
// error, or says it timed out after 45 s.
func DumpDOM(t testing.TB, bin, url string) (dom, stderr string, err error) {
	t.Helper()
	home := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	// The flags keep a closed network quiet: no background fetches, no
	// component updates, no sync, no QUIC probes.
	cmd := exec.CommandContext(ctx, bin,
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
		"--no-first-run", "--disable-background-networking", "--disable-component-update",
		"--disable-sync", "--disable-dev-shm-usage",
		"--user-data-dir="+t.TempDir(),
		"--dump-dom", url)
	cmd.Env = append(os.Environ(), "HOME="+home, "XDG_CONFIG_HOME="+home, "XDG_CACHE_HOME="+home)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Start(); err != nil {
		return "", "", err
	}
	pgid := cmd.Process.Pid
	err = cmd.Wait()
	if kerr := syscall.Kill(-pgid, syscall.SIGKILL); kerr != nil && !errors.Is(kerr, syscall.ESRCH) {
		t.Logf("kill chromium process group %d: %v", pgid, kerr)
	}
	if ctx.Err() != nil {
		err = fmt.Errorf("timed out after 45s: %w", err)
	}
	return out.String(), errOut.String(), err
}
