package httpcall_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter/hosted/httpcall"
)

func TestRetryAfter(t *testing.T) {
	future := time.Now().Add(90 * time.Second).UTC().Format(http.TimeFormat)
	past := time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat)
	for _, tc := range []struct {
		name, value string
		min, max    time.Duration
	}{
		{"seconds", "7", 7 * time.Second, 7 * time.Second},
		{"spaces", " 3 ", 3 * time.Second, 3 * time.Second},
		{"zero", "0", 0, 0},
		{"negative", "-5", 0, 0},
		{"garbage", "soon", 0, 0},
		{"absent", "", 0, 0},
		{"date ahead", future, 80 * time.Second, 90 * time.Second},
		{"date past", past, 0, 0},
	} {
		h := http.Header{}
		if tc.value != "" {
			h.Set("Retry-After", tc.value)
		}
		if got := httpcall.RetryAfter(h); got < tc.min || got > tc.max {
			t.Errorf("%s (%q): got %v, want within [%v, %v]", tc.name, tc.value, got, tc.min, tc.max)
		}
	}
	if got := httpcall.RetryAfter(nil); got != 0 {
		t.Errorf("nil header: got %v, want 0", got)
	}
}
