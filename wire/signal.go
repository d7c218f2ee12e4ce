package wire

import (
	"fmt"
	"strconv"
	"strings"
)

// signalNames are Linux's signal numbers, the numbers exit records carry
// and signal requests send.
var signalNames = map[int]string{
	1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 4: "SIGILL", 5: "SIGTRAP", 6: "SIGABRT",
	7: "SIGBUS", 8: "SIGFPE", 9: "SIGKILL", 10: "SIGUSR1", 11: "SIGSEGV", 12: "SIGUSR2",
	13: "SIGPIPE", 14: "SIGALRM", 15: "SIGTERM", 16: "SIGSTKFLT", 17: "SIGCHLD",
	18: "SIGCONT", 19: "SIGSTOP", 20: "SIGTSTP", 21: "SIGTTIN", 22: "SIGTTOU",
	23: "SIGURG", 24: "SIGXCPU", 25: "SIGXFSZ", 26: "SIGVTALRM", 27: "SIGPROF",
	28: "SIGWINCH", 29: "SIGIO", 30: "SIGPWR", 31: "SIGSYS",
}

// SignalString returns the name of Linux signal n ("SIGKILL" for 9),
// "SIGRTMIN+k" for real-time signals, or "SIG<n>" for anything else. It is
// never empty, so a signal death can never read as an exit.
func SignalString(n int) string {
	if s, ok := signalNames[n]; ok {
		return s
	}
	if n >= 34 && n <= 64 {
		return "SIGRTMIN+" + strconv.Itoa(n-34)
	}
	return "SIG" + strconv.Itoa(n)
}

// ParseSignal returns the Linux signal number s names: "TERM", "SIGTERM",
// "sigterm" or "15" (1-64; surrounding space ignored). runnerd's signal
// request and runner-shim's signal command both read it.
func ParseSignal(s string) (int, error) {
	str := strings.ToUpper(strings.TrimSpace(s))
	if n, err := strconv.Atoi(str); err == nil {
		if n < 1 || n > 64 {
			return 0, fmt.Errorf("signal %d out of range", n)
		}
		return n, nil
	}
	if !strings.HasPrefix(str, "SIG") {
		str = "SIG" + str
	}
	for n, name := range signalNames {
		if name == str {
			return n, nil
		}
	}
	return 0, fmt.Errorf("unknown signal %q", s)
}
