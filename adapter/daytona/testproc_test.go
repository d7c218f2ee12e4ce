package daytona

import (
	"os/exec"
	"strconv"
	"strings"

	"github.com/agentrunner/runner/internal/logsink"
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
type syncBuffer = logsink.Buffer
