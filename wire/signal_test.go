package wire

import (
	"testing"

	"golang.org/x/sys/unix"
)

// TestSignalNamesMatchLinux: the table is the kernel's numbering, as
// x/sys/unix spells it, for every named signal.
func TestSignalNamesMatchLinux(t *testing.T) {
	for n := 1; n <= 31; n++ {
		if got, want := SignalString(n), unix.SignalName(unix.Signal(n)); got != want {
			t.Errorf("SignalString(%d) = %q, want %q", n, got, want)
		}
		got, err := ParseSignal(unix.SignalName(unix.Signal(n)))
		if err != nil || got != n {
			t.Errorf("ParseSignal(%q) = %d, %v; want %d", unix.SignalName(unix.Signal(n)), got, err, n)
		}
	}
}

func TestParseSignal(t *testing.T) {
	tests := []struct {
		in   string
		want int
		err  string
	}{
		{"TERM", 15, ""}, {"SIGTERM", 15, ""}, {"sigkill", 9, ""}, {" 15 ", 15, ""}, {"64", 64, ""},
		{"0", 0, "signal 0 out of range"}, {"65", 0, "signal 65 out of range"}, {"-9", 0, "signal -9 out of range"},
		{"SIGNOPE", 0, `unknown signal "SIGNOPE"`}, {"", 0, `unknown signal ""`}, {"SIGRTMIN+1", 0, `unknown signal "SIGRTMIN+1"`},
	}
	for _, tc := range tests {
		got, err := ParseSignal(tc.in)
		if tc.err != "" {
			if err == nil || err.Error() != tc.err {
				t.Errorf("ParseSignal(%q) = %d, %v; want error %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseSignal(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
	for n, want := range map[int]string{9: "SIGKILL", 34: "SIGRTMIN+0", 40: "SIGRTMIN+6", 99: "SIG99", 0: "SIG0"} {
		if got := SignalString(n); got != want {
			t.Errorf("SignalString(%d) = %q, want %q", n, got, want)
		}
	}
}
