package daytona

import (
	"bytes"
	"os/exec"
	"strconv"
	"strings"
	"sync"
)

func execCommand(name string, args ...string) *exec.Cmd { return exec.Command(name, args...) }

func pidOf(s string) int {
	line, _, ok := strings.Cut(s, "\n")
	if !ok {
		return 0
	}
	n, _ := strconv.Atoi(line)
	return n
}

func itoa(n int) string { return strconv.Itoa(n) }

// syncBuffer is a bytes.Buffer safe for a writer and a reader at once.
type syncBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
