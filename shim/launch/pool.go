package launch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentrunner/runner/shim/internal/proto"
	"github.com/agentrunner/runner/shim/sessiondir"
)

// Pool is the one way a shim starts. Pool.Start starts one through a warm
// shim when one is idle and cold otherwise, with the same directory
// handling, readiness, errors and detachment either way; Prepare and
// Prepared.Start are the same start cut in two, so that a caller (runnerd)
// can commit its record while the shim prepares. A Pool of Size 0 keeps no
// warm shim, starts no goroutine and starts every shim cold.
//
// Warm shims are shim processes already started and detached, each
// waiting on a socket for a session directory, so that a start through the
// pool costs the command's fork/exec plus one round trip instead of two Go
// process starts (docs/benchmarks.md has the figures).
//
// A warm shim is started like any shim, through the short-lived --detach
// intermediate (its own session, reparented away, never a child of the
// pool's process), but in the background: a taken shim is replaced after
// the start that took it has its answer. It exits at once when its socket
// reaches EOF, which happens when Close shuts it or when the process
// holding the pool dies (the kernel closes the pool's end): a crashed or
// stopped runnerd never leaves warm shims behind. A shim that was given a
// session no longer reads that socket; it is the session's shim, detached
// like one started cold, and survives its launcher.
//
// Pool is safe for concurrent use. Whoever calls NewPool must call Close.
type Pool struct {
	exe  []string
	opts PoolOptions

	kick chan struct{} // a refill is wanted; buffered 1
	// life ends when Close begins (endLife); stop is its Done channel.
	// A warm shim's start is bounded by it, so Close cuts a start short.
	life      context.Context
	endLife   context.CancelFunc
	stop      <-chan struct{}
	done      chan struct{} // closed when the refill goroutine returned
	closeOnce sync.Once

	// helper: warm shims start the nsexec helper ahead (see HelperMode).
	helper atomic.Bool

	// mu guards the fields below.
	mu     sync.Mutex
	idle   []*warmShim
	closed bool
}

// warmShim is one idle warm shim, owned by the pool until taken.
type warmShim struct {
	conn  *net.UnixConn // our end of its socket
	pid   int
	stage string // its staging directory, ROOT/.warm-*
}

// warmTimeout bounds how long a refill waits for a new warm shim to say it
// is up.
const warmTimeout = 30 * time.Second

// PoolOptions configures a [Pool].
type PoolOptions struct {
	// Size is how many warm shims are kept; below 1, none (every start
	// is cold).
	Size int
	// Root is the absolute directory the session directories are made in.
	// Warm shims prepare their session in a staging directory there
	// (Root/.warm-*) and rename it into place; a start of a directory
	// elsewhere is cold.
	Root string
	// RetainBytes is the staged journals' retention (Spec.RetainBytes); a
	// spec asking for another, or for a TTY, gets its journal made on
	// start instead.
	RetainBytes int64
	// Helper says whether warm shims start the nsexec helper ahead (the
	// re-executed shim that places a command in cgroup v1 directories,
	// mounts its resolv.conf, or isolates it: exec.go), so a start that
	// needs it does not pay for its process start.
	Helper HelperMode
}

// HelperMode is PoolOptions.Helper.
type HelperMode int

const (
	// HelperAuto starts the helper ahead in every warm shim started after
	// a start through the pool needed one (on a host where every command
	// is placed in cgroup v1 directories, from the first start on), and
	// never before: a host that never needs it pays nothing.
	HelperAuto HelperMode = iota
	// HelperAlways starts it in every warm shim.
	HelperAlways
	// HelperNever never starts it ahead.
	HelperNever
)

// NewPool starts a pool that keeps opts.Size warm shims of exe and returns
// at once; the shims start in the background. exe is the argv prefix that
// runs the supervisor (package shim's Main), e.g.
// {"/usr/local/bin/runner-shim", "serve"} or {os.Executable(), "shim"};
// the pool appends its own arguments.
func NewPool(exe []string, opts PoolOptions) *Pool {
	if root, err := filepath.Abs(opts.Root); err == nil && opts.Root != "" {
		opts.Root = root
	} else {
		opts.Root = "" // no warm shim can stage: every start is cold
		opts.Size = 0
	}
	p := &Pool{exe: append([]string(nil), exe...), opts: opts,
		kick: make(chan struct{}, 1), done: make(chan struct{})}
	p.life, p.endLife = context.WithCancel(context.Background())
	p.stop = p.life.Done()
	p.helper.Store(opts.Helper == HelperAlways)
	if opts.Size <= 0 {
		close(p.done) // no refill goroutine: every start is cold
		return p
	}
	go p.refill()
	p.wake()
	return p
}

// Start launches a detached shim for a new session in dir and returns once
// the command runs, or with its start error (a *StartError for failures of
// the command itself; ErrExists, ErrInvalid for the request). It takes an
// idle warm shim when dir is one a warm shim can take (see Prepare), and
// starts one cold otherwise.
//
// dir is created with mode 0700 if needed and must not already hold a
// session. A cold shim is started through a short-lived intermediate
// process that starts the real shim in a new session and exits at once,
// so the shim is reparented to init (or the nearest subreaper) and never
// becomes a zombie of the launcher.
//
// If ctx ends before the shim reports, Start returns ctx's error; the
// session may still start (ReadStatus tells).
func (p *Pool) Start(ctx context.Context, dir string, spec sessiondir.Spec) (sessiondir.Status, error) {
	spec, err := withFilter(spec) // filter.go
	if err != nil {
		return sessiondir.Status{}, err
	}
	pr, abs, err := p.prepare(dir, spec)
	if err != nil {
		return sessiondir.Status{}, err
	}
	if pr != nil {
		return pr.Start(ctx)
	}
	return startWith(ctx, p.exe, abs, spec)
}

// Prepared is a session handed to a warm shim whose command has not
// started: the shim has made the session directory (with its journal,
// control socket and spec.json) and waits for Start or Cancel. Exactly
// one of them must be called.
type Prepared struct {
	w    *warmShim
	spec sessiondir.Spec
}

// Prepare hands dir and spec to an idle warm shim, which makes dir and
// readies everything but the command's start, and returns at once: the
// caller can do other work (runnerd commits its record) while the shim
// prepares. It returns nil, nil when no warm shim is idle or dir is not
// one a warm shim can take: a warm shim makes the directory itself (by
// renaming its staging directory), so only a directory directly in Root
// that does not exist yet.
func (p *Pool) Prepare(dir string, spec sessiondir.Spec) (*Prepared, error) {
	spec, err := withFilter(spec) // filter.go
	if err != nil {
		return nil, err
	}
	pr, _, err := p.prepare(dir, spec)
	return pr, err
}

// prepare is Prepare, and also returns dir made absolute (checkStart) for
// a cold start.
func (p *Pool) prepare(dir string, spec sessiondir.Spec) (*Prepared, string, error) {
	if len(p.exe) == 0 {
		return nil, "", fmt.Errorf("start shim: %w: empty exe", sessiondir.ErrInvalid)
	}
	abs, err := checkStart(dir, spec)
	if err != nil {
		return nil, "", err
	}
	if p.opts.Size <= 0 {
		return nil, abs, nil // no warm shim, ever: nothing else to check
	}
	if p.opts.Helper == HelperAuto && !p.helper.Load() && spec.NeedsHelper() {
		p.helper.Store(true) // for the warm shims started from now on
	}
	if filepath.Dir(abs) != p.opts.Root {
		return nil, abs, nil
	}
	if _, err := os.Lstat(abs); !errors.Is(err, fs.ErrNotExist) {
		return nil, abs, nil
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, "", fmt.Errorf("start shim: %w", err)
	}
	for w := p.take(); w != nil; w = p.take() {
		if w.give(abs, b) {
			return &Prepared{w: w, spec: spec}, abs, nil
		}
		// It died while idle (killed by someone): it never saw dir.
	}
	return nil, abs, nil
}

// Start lets the prepared command start and waits for the readiness line,
// as [Pool.Start] does.
func (pr *Prepared) Start(ctx context.Context) (sessiondir.Status, error) {
	defer pr.w.conn.Close()
	// A shim that failed while preparing has reported and closed its end:
	// the write fails, and its report is read below.
	pr.w.conn.Write([]byte("go\n"))
	st, err := awaitReady(ctx, pr.w.conn, nil)
	if err == nil {
		st.ID, st.TTY = pr.spec.ID, pr.spec.TTY
	}
	return st, err
}

// Cancel calls the start off: the shim removes the session directory and
// exits without starting the command. Cancel waits (up to retireTimeout)
// until it has.
func (pr *Prepared) Cancel() {
	pr.w.retire()
}

// Close stops refilling, waits for the refill goroutine, and shuts every
// idle warm shim's socket, so each removes its staging directory and exits;
// it waits (up to retireTimeout) until they have closed their ends, so
// that no staging directory is left when it returns. Shims already given
// a session are not touched. Close is idempotent; Start after Close starts
// shims cold.
func (p *Pool) Close() error {
	p.closeOnce.Do(func() {
		p.mu.Lock()
		p.closed = true
		idle := p.idle
		p.idle = nil
		p.mu.Unlock()
		p.endLife()
		<-p.done
		var wg sync.WaitGroup
		for _, w := range idle {
			wg.Add(1)
			go func() {
				defer wg.Done()
				w.retire()
			}()
		}
		wg.Wait()
	})
	return nil
}

func (p *Pool) wake() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// take removes one idle warm shim, or returns nil, and asks for a refill.
// With none idle it does not wait for one being started: that one takes
// about as long as a cold start (two process starts), and starting cold
// meanwhile adds a start in parallel (measured: waiting made a burst of
// starts 3x slower).
func (p *Pool) take() *warmShim {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.idle) == 0 {
		return nil
	}
	w := p.idle[0]
	p.idle = p.idle[1:]
	p.wake()
	return w
}

// Idle returns how many warm shims wait for a session now.
func (p *Pool) Idle() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle)
}

// WarmPIDs returns the pids of the idle warm shims.
func (p *Pool) WarmPIDs() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []int
	for _, w := range p.idle {
		out = append(out, w.pid)
	}
	return out
}

// refill keeps the pool at size until stop is closed. The missing shims
// are started side by side: a start is mostly waiting on process starts and
// file creation, and a burst of takes empties the pool at once. A failed
// start is retried with backoff, so a broken shim binary costs a start a
// second at most, not a busy loop.
func (p *Pool) refill() {
	defer close(p.done)
	backoff := 100 * time.Millisecond
	for {
		p.mu.Lock()
		need := 0
		if !p.closed {
			need = p.opts.Size - len(p.idle)
		}
		p.mu.Unlock()
		if need <= 0 {
			select {
			case <-p.stop:
				return
			case <-p.kick:
			}
			continue
		}
		// Each shim joins the pool as soon as it is up, not when the
		// batch is.
		var (
			wg     sync.WaitGroup
			failed atomic.Bool
		)
		for range need {
			wg.Add(1)
			go func() {
				defer wg.Done()
				w, err := p.startWarm()
				p.mu.Lock()
				keep := err == nil && !p.closed
				if keep {
					p.idle = append(p.idle, w)
				}
				p.mu.Unlock()
				switch {
				case err != nil:
					failed.Store(true)
				case !keep:
					w.retire() // started after Close
				}
			}()
		}
		wg.Wait()
		p.mu.Lock()
		closed := p.closed
		p.mu.Unlock()
		if closed {
			return
		}
		if failed.Load() {
			select {
			case <-p.stop:
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
	}
}

// startWarm starts one warm shim, detached (detachedCmd), and waits for
// its "warm PID" line.
func (p *Pool) startWarm() (*warmShim, error) {
	conn, child, err := proto.SocketPair("warm")
	if err != nil {
		return nil, fmt.Errorf("start warm shim: %w", err)
	}
	args := []string{"--warm-fd=3", "--warm-root=" + p.opts.Root, "--warm-retain=" + strconv.FormatInt(p.opts.RetainBytes, 10)}
	if p.helper.Load() {
		args = append(args, "--warm-nsexec")
	}
	cmd, err := detachedCmd(p.exe, proto.ModeWarm, args...)
	if err != nil {
		child.Close()
		conn.Close()
		return nil, fmt.Errorf("start warm shim: %w", err)
	}
	cmd.ExtraFiles = []*os.File{child}
	err = cmd.Start()
	child.Close()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("start warm shim: %w", err)
	}
	// The intermediate exits once the shim is started; Close does not
	// wait out its exit (under -race every exit sleeps a second).
	waited := make(chan struct{})
	go func() { cmd.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-p.stop:
		cmd.Process.Kill()
		<-waited
		// A shim it started sees EOF, removes its staging directory and
		// exits; retire waits for that.
		(&warmShim{conn: conn}).retire()
		return nil, errors.New("start warm shim: pool closed")
	}

	// Bounded by warmTimeout and by the pool's life: either ends the read.
	ctx, cancel := context.WithTimeout(p.life, warmTimeout)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { conn.SetReadDeadline(time.Now()) })
	defer stop()
	// "warm PID STAGE"; the staging directory's path may hold spaces.
	line, err := readLine(conn, 4096)
	f := strings.SplitN(line, " ", 3)
	if err != nil || len(f) != 3 || f[0] != "warm" {
		(&warmShim{conn: conn}).retire() // one still preparing cleans up first
		return nil, fmt.Errorf("start warm shim: got %q (%v)", line, err)
	}
	pid, err := strconv.Atoi(f[1])
	if err != nil || filepath.Dir(f[2]) != p.opts.Root || !strings.HasPrefix(filepath.Base(f[2]), ".warm-") {
		(&warmShim{conn: conn}).retire()
		return nil, fmt.Errorf("start warm shim: got %q", line)
	}
	conn.SetReadDeadline(time.Time{})
	return &warmShim{conn: conn, pid: pid, stage: f[2]}, nil
}

// give hands dir and the spec (JSON) to the warm shim. It reports false
// when the shim could not be reached (it died while idle), in which case
// it never saw dir.
func (w *warmShim) give(dir string, spec []byte) bool {
	msg := make([]byte, 0, len(dir)+len(spec)+2)
	msg = append(append(append(append(msg, dir...), '\n'), spec...), '\n')
	if _, err := w.conn.Write(msg); err != nil {
		w.conn.Close()
		// It died while idle (killed): what it staged is nobody's now.
		if w.stage != "" {
			os.RemoveAll(w.stage)
		}
		return false
	}
	return true
}

// retire makes an idle warm shim exit: it reads EOF, removes its staging
// directory and closes its end, which retire waits for.
func (w *warmShim) retire() {
	defer w.conn.Close()
	if w.conn.CloseWrite() != nil {
		return
	}
	w.conn.SetReadDeadline(time.Now().Add(retireTimeout))
	io.Copy(io.Discard, w.conn) // until the shim closes its end: EOF
}

// retireTimeout bounds how long retire waits for a warm shim to clean up.
const retireTimeout = 2 * time.Second

// Root is the directory the pool makes session directories in
// (PoolOptions.Root).
func (p *Pool) Root() string { return p.opts.Root }

// HelperAhead reports whether warm shims started from now on start the
// nsexec helper ahead (HelperAlways, or HelperAuto once a start needed it).
func (p *Pool) HelperAhead() bool { return p.helper.Load() }
