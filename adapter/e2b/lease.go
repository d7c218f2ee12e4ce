package e2b

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// DefaultTimeout is the API's time to live of a sandbox created without
// one (NewSandbox.timeout's default in spec/openapi.yml).
const DefaultTimeout = 15 * time.Second

// keeperTick is how often the keeper looks for leases due a renewal.
const keeperTick = 100 * time.Millisecond

// The lease: E2B ends every sandbox's time to live whatever runs in it,
// so while the adapter holds a call or a stream into a sandbox (every one
// is an envd process, envdExec.Exec) it sets the sandbox's timeout anew
// (POST /sandboxes/{id}/timeout) every third of it. A sandbox nobody
// uses is left to its time to live, which pauses it (the adapter creates
// with autoPause), and the next use resumes it (POST .../connect) before
// its first envd request.
//
// leases is owned by the Adapter: newLeases starts the keeper goroutine,
// close stops it and waits for it. Its methods are safe for concurrent
// use.
type leases struct {
	c   *Client
	log *slog.Logger

	mu sync.Mutex // guards m
	m  map[string]*lease

	stop context.CancelFunc
	done chan struct{}
}

// lease is one sandbox's.
type lease struct {
	ttl     time.Duration // the sandbox's time to live, whole seconds
	uses    int           // calls and streams in flight
	renewed time.Time     // when its time to live last restarted; zero: unknown
	// onConnect takes the sandbox a connect answered (its envd token).
	onConnect func(Sandbox)
}

func newLeases(c *Client, log *slog.Logger) *leases {
	ctx, cancel := context.WithCancel(context.Background())
	l := &leases{c: c, log: log, m: map[string]*lease{}, stop: cancel, done: make(chan struct{})}
	go l.keep(ctx)
	return l
}

// close stops the keeper and waits for it. Sandboxes are left to their
// time to live, which pauses them.
func (l *leases) close() {
	l.stop()
	<-l.done
}

// add registers a sandbox with its time to live; renewed is when it
// last started (zero: unknown, the first use connects).
func (l *leases) add(id string, ttl time.Duration, renewed time.Time, onConnect func(Sandbox)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.m[id]; !ok {
		l.m[id] = &lease{ttl: ttl, renewed: renewed, onConnect: onConnect}
	}
}

// remove forgets a sandbox (destroyed, or not this adapter's any more).
func (l *leases) remove(id string) {
	l.mu.Lock()
	delete(l.m, id)
	l.mu.Unlock()
}

// acquire marks one use of sandbox id and returns its release. When the
// sandbox's time to live may have run out since its last renewal (half
// of it passed), it connects first: a paused sandbox resumes, a running
// one has its time to live extended. A failed connect is left for the
// use itself to meet and judge (envdExec.confirm).
func (l *leases) acquire(ctx context.Context, id string) (release func()) {
	l.mu.Lock()
	ls, ok := l.m[id]
	if !ok {
		l.mu.Unlock()
		return func() {}
	}
	ls.uses++
	now := time.Now()
	stale := ls.renewed.IsZero() || now.Sub(ls.renewed) >= ls.ttl/2
	l.mu.Unlock()
	if stale {
		l.connect(ctx, id, ls)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			ls.uses--
			l.mu.Unlock()
		})
	}
}

// resume connects a sandbox this adapter holds (a paused one resumes)
// and reports whether it answered.
func (l *leases) resume(ctx context.Context, id string) bool {
	l.mu.Lock()
	ls := l.m[id]
	l.mu.Unlock()
	return ls != nil && l.connect(ctx, id, ls)
}

// connect resumes or extends a sandbox and records the renewal.
func (l *leases) connect(ctx context.Context, id string, ls *lease) bool {
	start := time.Now()
	sb, resumed, err := l.c.Connect(ctx, id, seconds(ls.ttl))
	if err != nil {
		l.log.LogAttrs(ctx, slog.LevelDebug, "e2b: connect sandbox", slog.String("sandbox", id), slog.Any("error", err))
		return false
	}
	if resumed {
		l.log.LogAttrs(ctx, slog.LevelInfo, "e2b: resumed a paused sandbox", slog.String("sandbox", id))
	}
	l.mu.Lock()
	ls.renewed = start
	l.mu.Unlock()
	if ls.onConnect != nil && !sb.EnvdAccessToken.IsZero() {
		ls.onConnect(sb)
	}
	return true
}

// keep renews every lease in use once a third of its time to live has
// passed, until ctx ends. Each renewal is bounded by that third.
func (l *leases) keep(ctx context.Context) {
	defer close(l.done)
	t := time.NewTicker(keeperTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		type due struct {
			id string
			ls *lease
		}
		var dues []due
		now := time.Now()
		l.mu.Lock()
		for id, ls := range l.m {
			if ls.uses > 0 && now.Sub(ls.renewed) >= ls.ttl/3 {
				dues = append(dues, due{id, ls})
			}
		}
		l.mu.Unlock()
		for _, d := range dues {
			l.renew(ctx, d.id, d.ls)
		}
	}
}

// renew sets the sandbox's time to live from now; when that fails (a
// paused sandbox is 404 to it), it connects, which resumes.
func (l *leases) renew(ctx context.Context, id string, ls *lease) {
	ctx, cancel := context.WithTimeout(ctx, max(ls.ttl/3, time.Second))
	defer cancel()
	start := time.Now()
	if err := l.c.SetTimeout(ctx, id, seconds(ls.ttl)); err != nil {
		l.log.LogAttrs(ctx, slog.LevelDebug, "e2b: renew sandbox timeout", slog.String("sandbox", id), slog.Any("error", err))
		l.connect(ctx, id, ls)
		return
	}
	l.mu.Lock()
	ls.renewed = start
	l.mu.Unlock()
}

// seconds is d in whole seconds, at least 1.
func seconds(d time.Duration) int32 { return int32(max(d/time.Second, 1)) }

// sandboxTTL is the time to live to keep for sb: the configured one, or
// less when the control plane gave the sandbox less at its start (its
// endAt − startedAt), in whole seconds.
func sandboxTTL(configured time.Duration, sb Sandbox) time.Duration {
	if !sb.EndAt.IsZero() && sb.EndAt.After(sb.StartedAt) {
		if d := sb.EndAt.Sub(sb.StartedAt).Truncate(time.Second); d >= time.Second && d < configured {
			return d
		}
	}
	return configured
}
