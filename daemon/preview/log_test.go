package preview

import (
	"log/slog"
	"testing"

	"github.com/agentrunner/runner/internal/logsink"
)

// logBuffer collects a Server's log output so a test can check that no token
// leaks into it.
type logBuffer = logsink.Buffer

// newTestLogger returns a debug-level logger into a buffer, printed with -v.
func newTestLogger(t *testing.T) (*slog.Logger, *logBuffer) {
	t.Helper()
	b := &logBuffer{}
	t.Cleanup(func() {
		if testing.Verbose() {
			t.Logf("server log:\n%s", b.String())
		}
	})
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug})), b
}
