package preview

import (
	"bytes"
	"log/slog"
	"sync"
	"testing"
)

// logBuffer collects a Server's log output so a test can check that no token
// leaks into it.
type logBuffer struct {
	mu  sync.Mutex // guards buf
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

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
