package daemon

import "testing"

// TestIsLoopbackAddr: only loopback addresses and "localhost" count as
// loopback; a wildcard, an empty host and any other name do not (a name
// may resolve anywhere), so plain HTTP there needs --insecure-listen.
func TestIsLoopbackAddr(t *testing.T) {
	for _, tc := range []struct {
		addr string
		want bool
	}{
		{"127.0.0.1:7323", true},
		{"127.1.2.3:0", true},
		{"[::1]:7323", true},
		{"localhost:7323", true},
		{"0.0.0.0:7323", false},
		{"[::]:7323", false},
		{":7323", false},
		{"10.0.0.5:7323", false},
		{"runner.example:7323", false},
		{"[::ffff:127.0.0.1]:1", true},
		{"127.0.0.1", false}, // no port: not an address
	} {
		if got := isLoopbackAddr(tc.addr); got != tc.want {
			t.Errorf("isLoopbackAddr(%q): got %v, want %v", tc.addr, got, tc.want)
		}
	}
}
