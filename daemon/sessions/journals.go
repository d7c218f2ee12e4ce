package sessions

import (
	"log/slog"
	"sync/atomic"

	"github.com/agentrunner/runner/daemon/apierr"
	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/journal"
)

// OpenJournal opens the session's journal for reading.
func (s *Manager) OpenJournal(ss registry.Session) (*journal.Journal, error) {
	j, err := journal.Open(journalDir(s.Dir(ss)))
	if err != nil {
		return nil, apierr.Unavailable("open journal: %v", err)
	}
	return j, nil
}

// OpenReader opens one stream at cursor, woken by the manager's shared
// watcher. Its cursor errors (journal.CursorError) are answered truncated
// (416) or invalid (400) by classify.
func (s *Manager) OpenReader(j *journal.Journal, stream string, cursor int64, follow bool) (*journal.Reader, error) {
	return j.NewReaderWatched(s.watcher, stream, cursor, follow)
}

// newWatcher makes the journal watcher every follow reader of this runnerd
// shares. When the kernel refuses inotify (instances or watches exhausted
// by other processes of the user), readers poll every
// journal.DefaultPollInterval instead of failing the attach; that is
// logged, at 1, 2, 4, 8... fallbacks so a degraded host does not flood
// the log.
func newWatcher(log *slog.Logger) *journal.Watcher {
	var n atomic.Int64
	w := journal.NewWatcher(journal.WatcherOptions{OnPoll: func(dir string, err error) {
		if c := n.Add(1); c&(c-1) == 0 {
			log.Warn("journal follow reader polls: inotify unavailable", "dir", dir, "err", err, "fallbacks", c, "interval", journal.DefaultPollInterval)
		}
	}})
	if err := w.Stats().Unavailable; err != nil {
		log.Warn("journal watcher has no inotify instance; follow readers poll", "err", err, "interval", journal.DefaultPollInterval)
	}
	return w
}
