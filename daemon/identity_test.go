package daemon_test

import (
	"os"
	"path/filepath"
	"testing"
)

// passableTempDir is a t.TempDir whose parent another uid may pass
// through (0711): a state directory whose isolated sandboxes' commands,
// running as their own uids, can reach their workspaces. t.TempDir's
// parent is 0700.
func passableTempDir(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	if err := os.Chmod(filepath.Dir(d), 0o711); err != nil {
		t.Fatal(err)
	}
	return d
}
