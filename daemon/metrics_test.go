package daemon_test

import (
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/agentrunner/runner/wire"
)

// metricValue returns the value of an unlabelled series, or -1.
func metricValue(body []byte, name string) int64 {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\d+)$`).FindSubmatch(body)
	if m == nil {
		return -1
	}
	n, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return n
}

// TestMetricsJournalWatcher: the shared journal watcher's state is on
// /metrics, and the running gauge leaves out a session whose command
// ended even when no request has looked at it since.
func TestMetricsJournalWatcher(t *testing.T) {
	a := startDaemon(t)
	a.createSandbox("box")
	live := a.spawn("box", wire.CreateSession{Argv: []string{"sleep", "60"}})
	a.spawn("box", wire.CreateSession{ID: "quick", Argv: []string{"true"}})
	ctx := ctxFor(t, 30*time.Second)
	conn := dialAttach(t, ctx, a, "box", live.ID)
	defer conn.Close(websocket.StatusNormalClosure, "")

	deadline := time.Now().Add(20 * time.Second)
	for {
		body := a.do("GET", "/metrics", nil).body
		got := map[string]int64{}
		for _, name := range []string{
			"runnerd_journal_watches", "runnerd_journal_followers",
			"runnerd_journal_watch_overflows_total", "runnerd_journal_poll_fallbacks_total",
			"runnerd_journal_inotify_unavailable", "runnerd_sessions_running",
		} {
			got[name] = metricValue(body, name)
			if got[name] < 0 {
				t.Fatalf("metrics lack %s:\n%s", name, body)
			}
		}
		ok := got["runnerd_journal_watches"] >= 1 && got["runnerd_journal_followers"] >= 1 &&
			got["runnerd_journal_watch_overflows_total"] == 0 && got["runnerd_journal_poll_fallbacks_total"] == 0 &&
			got["runnerd_journal_inotify_unavailable"] == 0 && got["runnerd_sessions_running"] == 1
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("got %v, want watches and followers >= 1, no overflows, fallbacks or unavailability, and 1 running (the sleep; true has ended)", got)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// With the attach gone, no follower is left.
	conn.Close(websocket.StatusNormalClosure, "")
	for {
		if n := metricValue(a.do("GET", "/metrics", nil).body, "runnerd_journal_followers"); n == 0 {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("runnerd_journal_followers after the attach closed: got %d, want 0", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
