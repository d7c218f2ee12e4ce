package shim

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"golang.org/x/sys/unix"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/agentrunner/runner/journal"
)

// DrainGrace bounds how long the shim keeps reading output after the
// command exited, for the case where a grandchild still holds the pipe or
// terminal open (see the package documentation).
const DrainGrace = 2 * time.Second

const (
	sweepWindow  = 20 * time.Millisecond // final non-blocking sweep after DrainGrace
	sweepMax     = 1 << 20               // bytes the final sweep reads at most
	pumpBuf      = 32 << 10              // read buffer per output stream
	minBackoff   = 10 * time.Millisecond // first wait between journal write retries
	maxBackoff   = 2 * time.Second       // between journal write retries
	closeTimeout = 2 * time.Second       // for handlers to answer at shutdown
)

type output struct {
	stream string
	f      *os.File // our read end: a pipe, or the PTY master
}

// server is the shim process's state. It owns every goroutine it starts:
// run waits for all of them before it returns.
type server struct {
	dir  string
	spec Spec
	ln   *net.UnixListener
	sock string
	cmd  *exec.Cmd
	pid  int
	at   time.Time // when the command was started

	jw atomic.Pointer[journal.Writer] // replaced only by Finish retries

	master *os.File // PTY master (TTY mode), nil otherwise
	stdin  *os.File // where stdin bytes go: the pipe's write end, or master
	outs   []output

	// stdinMu serializes stdin writes and close, and guards the fields
	// below; it is never held by resize, signal, terminate or status.
	stdinMu     sync.Mutex
	stdinClosed bool
	atLineStart bool // TTY: the last stdin byte was '\n' (or none yet)

	exited  chan struct{} // closed once the child is reaped
	done    chan struct{} // closed once the exit record is published
	closing chan struct{} // closed when shutdown starts: no new connections

	// reap owns every wait of the process (see reaper.go); it runs from
	// run until no descendant is left.
	reap *reaper

	// stopAsked is set by the terminate op before it signals the command:
	// the exit record of a command that ends after it says Terminated.
	stopAsked atomic.Bool

	// mu guards the fields below.
	mu       sync.Mutex
	exit     *journal.Exit
	writeErr string
	conns    map[*net.UnixConn]struct{}

	pumps    sync.WaitGroup // output pumps
	handlers sync.WaitGroup // acceptor and connection handlers

	// closers undo what prepare and start made, in reverse (undo); used
	// only before the command runs.
	closers []func()

	// startedFile is started.json, created by prepare; specFile is
	// spec.json, created by a warm shim (stage) before it has a spec.
	startedFile, specFile *pendingFile

	// syncParent, if set, is a directory run fsyncs in the background:
	// the parent a warm shim's staging directory was renamed in.
	syncParent string
}

// newServer starts the session of dir, whose spec.json says what to run
// (a cold start): on success the command runs, the journal and control
// socket exist, and started.json is written. On failure nothing is left
// running and the files it created are removed.
func newServer(dir string) (*server, error) {
	var spec Spec
	if err := readJSON(filepath.Join(dir, SpecFile), &spec); err != nil {
		return nil, fmt.Errorf("read spec: %w", err)
	}
	if err := spec.validate(); err != nil {
		return nil, err
	}
	// DeferCreateSync: the journal's creation is made durable at its first
	// sync point, not before the readiness report (see journal's doc).
	s, err := prepare(dir, journalOptions(spec, true))
	if err != nil {
		return nil, err
	}
	if err := s.start(spec, nil); err != nil {
		s.undo()
		return nil, err
	}
	return s, nil
}

// journalOptions is the journal a session of spec needs.
func journalOptions(spec Spec, deferSync bool) journal.Options {
	return journal.Options{Streams: spec.Streams(), RetainBytes: spec.RetainBytes, DeferCreateSync: deferSync}
}

// prepare makes what a session needs before it knows its command, in dir:
// the control socket (listening), the journal (opts) and the pid file.
// A warm shim prepares a staging directory ahead of time (moveTo then
// renames it into place); a cold start prepares the session directory.
// On failure what it made is removed; on success undo removes it.
func prepare(dir string, opts journal.Options) (_ *server, err error) {
	s := &server{dir: dir, exited: make(chan struct{}), done: make(chan struct{}), closing: make(chan struct{}),
		conns: map[*net.UnixConn]struct{}{}, atLineStart: true}
	defer func() {
		if err != nil {
			s.undo()
		}
	}()
	if s.sock, err = socketPath(dir); err != nil {
		return nil, err
	}
	os.Remove(s.sock) // a stale socket of a crashed attempt
	s.ln, err = net.ListenUnix("unix", &net.UnixAddr{Name: s.sock, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen on control socket: %w", err)
	}
	s.ln.SetUnlinkOnClose(false) // removed explicitly, after the exit record
	s.closers = append(s.closers, func() { s.ln.Close(); os.Remove(s.sock) })

	if err := s.createJournal(opts); err != nil {
		return nil, err
	}
	if s.startedFile, err = createPending(dir, StartedFile); err != nil {
		return nil, fmt.Errorf("create %s: %w", StartedFile, err)
	}
	s.closers = append(s.closers, func() { s.startedFile.discard(s.dir) })
	pidFile := func() string { return filepath.Join(s.dir, PIDFile) }
	if err := writeFileAtomic(pidFile(), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("write pid file: %w", err)
	}
	s.closers = append(s.closers, func() { os.Remove(pidFile()) })
	return s, nil
}

// createJournal creates the session's journal in s.dir; undo removes it.
func (s *server) createJournal(opts journal.Options) error {
	jw, err := journal.Create(filepath.Join(s.dir, JournalDir), opts)
	if err != nil {
		return fmt.Errorf("create journal: %w", err)
	}
	s.jw.Store(jw)
	s.closers = append(s.closers, func() {
		if jw := s.jw.Load(); jw != nil {
			jw.Close()
		}
		os.RemoveAll(filepath.Join(s.dir, JournalDir))
	})
	return nil
}

// stage makes what a warm shim prepares beyond prepare: spec.json,
// created empty under its temporary name, for adopt to fill.
func (s *server) stage() (err error) {
	if s.specFile, err = createPending(s.dir, SpecFile); err != nil {
		return fmt.Errorf("create %s: %w", SpecFile, err)
	}
	s.closers = append(s.closers, func() { s.specFile.discard(s.dir) })
	return nil
}

// moveTo renames the prepared (staging) directory to dir, which must not
// exist yet, and makes s the shim of dir: the listening socket, the
// journal and the pid file move with it, by inode.
func (s *server) moveTo(dir string) error {
	sock, err := socketPath(dir)
	if err != nil {
		return err
	}
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("%w: session directory %q is not absolute", ErrInvalid, dir)
	}
	err = unix.Renameat2(unix.AT_FDCWD, s.dir, unix.AT_FDCWD, dir, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EINVAL) {
		// A file system without RENAME_NOREPLACE: check, then rename.
		if _, err = os.Lstat(dir); err == nil {
			err = unix.EEXIST
		} else if errors.Is(err, fs.ErrNotExist) {
			err = os.Rename(s.dir, dir)
		}
	}
	if errors.Is(err, unix.EEXIST) || errors.Is(err, unix.ENOTEMPTY) {
		return fmt.Errorf("start shim %s: %w", dir, ErrExists)
	}
	if err != nil {
		return fmt.Errorf("move staged session to %s: %w", dir, err)
	}
	s.dir, s.sock = dir, sock
	return s.jw.Load().Relocate(filepath.Join(dir, JournalDir))
}

// adopt makes the moved directory spec's session: it writes spec.json
// and, when spec needs another journal than the one staged (a TTY has one
// stream; another retention), replaces the journal.
func (s *server) adopt(spec Spec, staged journal.Options) error {
	b, err := json.Marshal(spec)
	if err != nil {
		return fmt.Errorf("%w: encode spec: %v", ErrInvalid, err)
	}
	if err := s.specFile.publish(s.dir, b); err != nil {
		return fmt.Errorf("write spec: %w", err)
	}
	want := journalOptions(spec, true)
	if slices.Equal(want.Streams, staged.Streams) && want.RetainBytes == staged.RetainBytes {
		return nil
	}
	s.jw.Load().Close()
	jdir := filepath.Join(s.dir, JournalDir)
	if err := os.RemoveAll(jdir); err != nil {
		return fmt.Errorf("replace staged journal: %w", err)
	}
	jw, err := journal.Create(jdir, want)
	if err != nil {
		return fmt.Errorf("create journal: %w", err)
	}
	s.jw.Store(jw)
	return nil
}

// undo removes what prepare and start made, last first. Only for a
// server whose command never started (or was killed by start).
func (s *server) undo() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
	s.closers = nil
}

// start starts spec's command in the prepared s: on success the command
// runs and started.json is written. gate, if not nil, is called once all
// but the command's fork/exec is done; an error from it starts nothing and
// is returned. On failure nothing is left running; the caller undoes the
// rest.
func (s *server) start(spec Spec, gate func() error) (err error) {
	s.spec = spec
	var childEnds []*os.File // closed in the shim once the child has them
	defer func() {
		for _, f := range childEnds {
			f.Close()
		}
	}()

	path, err := lookPath(s.spec.Argv[0], s.spec.Env, s.spec.Dir)
	if err != nil {
		return fmt.Errorf("start %s: %w", s.spec.Argv[0], &commandError{err})
	}
	cmd := &exec.Cmd{Path: path, Args: s.spec.Argv, Env: s.spec.Env, Dir: s.spec.Dir}
	if cmd.Env == nil {
		cmd.Env = []string{} // never the shim's own environment
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if s.spec.User != "" {
		if cmd.SysProcAttr.Credential, err = credential(s.spec.User); err != nil {
			return &commandError{err}
		}
	}
	if s.spec.TTY {
		rows, cols := s.spec.Rows, s.spec.Cols
		if rows == 0 {
			rows = 24
		}
		if cols == 0 {
			cols = 80
		}
		master, slave, err := openPTY(rows, cols)
		if err != nil {
			return err
		}
		s.closers = append(s.closers, func() { master.Close() })
		childEnds = append(childEnds, slave)
		s.master, s.stdin = master, master
		s.outs = []output{{"stdout", master}}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
		cmd.SysProcAttr.Setctty = true
		cmd.SysProcAttr.Ctty = 0 // the child's fd 0
	} else {
		var pipes [3][2]*os.File
		for i := range pipes {
			r, w, err := os.Pipe()
			if err != nil {
				return fmt.Errorf("create pipe: %w", err)
			}
			pipes[i] = [2]*os.File{r, w}
			childEnds = append(childEnds, pipes[i][0], pipes[i][1])
		}
		s.stdin = pipes[0][1]
		s.outs = []output{{"stdout", pipes[1][0]}, {"stderr", pipes[2][0]}}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = pipes[0][0], pipes[1][1], pipes[2][1]
		// Ours from here: the child's ends stay in childEnds.
		childEnds = []*os.File{pipes[0][0], pipes[1][1], pipes[2][1]}
		s.closers = append(s.closers, func() {
			for _, f := range []*os.File{pipes[0][1], pipes[1][0], pipes[2][0]} {
				f.Close()
			}
		})
	}

	// Before the command starts: every process it starts stays below the
	// shim, even one whose parent has died (reaper.go).
	if err := setSubreaper(); err != nil {
		return err
	}
	if gate != nil {
		if err := gate(); err != nil {
			return err
		}
	}
	s.at = time.Now().UTC()
	if err := startCommand(cmd, s.spec); err != nil {
		return fmt.Errorf("start %s: %w", s.spec.Argv[0], err)
	}
	s.cmd, s.pid = cmd, cmd.Process.Pid
	s.reap = newReaper(s.pid)
	if s.spec.StdinClosed {
		s.stdin.Close() // the command reads EOF, as after close-stdin
		s.stdinClosed = true
	}
	b, _ := json.Marshal(started{ShimPID: os.Getpid(), PID: s.pid, StartedAt: s.at})
	if err := s.startedFile.publish(s.dir, b); err != nil {
		syscall.Kill(-s.pid, syscall.SIGKILL)
		cmd.Wait()
		return fmt.Errorf("write %s: %w", StartedFile, err)
	}
	return nil
}

// run supervises the command to its end, publishes the exit record, then
// keeps serving while any descendant of the command is still alive (the
// shim is their reaper), and returns once none is left and every
// goroutine has stopped.
func (s *server) run() {
	// From here on the reaper is the process's only waiter: the command's
	// status comes from it, never from exec.Cmd.Wait. Owned by run, which
	// waits for allDone below.
	go s.reap.loop()
	for _, o := range s.outs {
		s.pumps.Add(1)
		go s.pump(o)
	}
	s.handlers.Add(1)
	go s.accept()
	synced := make(chan struct{})
	// Owned by run, which waits for it below. Its error is only logged:
	// the session's own durability is the journal's.
	go func() {
		defer close(synced)
		if s.syncParent != "" {
			if err := syncDir(s.syncParent); err != nil {
				fmt.Fprintf(os.Stderr, "shim %s: sync %s: %v\n", s.dir, s.syncParent, err)
			}
		}
	}()
	defer func() { <-synced }()

	sigs := make(chan os.Signal, 1)
	// Caught rather than ignored: an ignored disposition would be inherited
	// by commands started later, a caught one is reset by execve.
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	fwdDone := make(chan struct{})
	// Forwards SIGTERM/SIGINT sent to the shim to the command's group and
	// to the group of every other process below the shim, so that
	// stopping the shim politely stops the session and still records its
	// exit. Owned by run: stopped below once nothing is left below the
	// shim.
	go func() {
		defer close(fwdDone)
		for {
			select {
			case sig := <-sigs:
				if sig != syscall.SIGHUP {
					skip := 0
					if !s.isExited() {
						s.signalGroup(syscall.SIGTERM)
						skip = s.pid // the command leads its own group
					}
					signalTree(syscall.SIGTERM, skip)
				}
			case <-s.reap.allDone:
				return
			}
		}
	}()

	<-s.reap.mainDone
	s.cmd.Process.Release() // reaped by the reaper: only the handle is left
	close(s.exited)
	// A stdin write blocked on a child that will never read fails now.
	s.stdin.SetWriteDeadline(time.Now())

	drain := time.AfterFunc(DrainGrace, func() {
		for _, o := range s.outs {
			o.f.SetReadDeadline(time.Now())
		}
	})
	s.pumps.Wait()
	drain.Stop()

	rec := exitRecord(s.reap.status, s.reap.err)
	// Read after the reap: a terminate that asked before the command ended
	// has set it by now (it sets it before signalling).
	if s.stopAsked.Load() && rec.Reason != journal.ReasonLost {
		rec.Terminated = true
	}
	s.finish(rec)

	// Linger: a descendant that outlived the command (a daemon it
	// started, a double fork) is reparented to the shim, which stays its
	// reaper, answers status (with the count) and terminate (which kills
	// them) until the last one is gone.
	<-s.reap.allDone
	signal.Stop(sigs)
	<-fwdDone
	s.shutdown()
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// awaitReadable returns once f has something to read, is at EOF, or its
// read deadline passed (what a Read would then return, Read says), without
// a buffer; at once for a file the runtime's poller does not handle.
func awaitReadable(f *os.File) {
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	rc.Read(func(fd uintptr) bool {
		// Asked, not assumed: the poller is edge-triggered and RawConn
		// forgets a readiness it saw before, so bytes already buffered
		// must be found here or they would wait for the next write.
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(p, 0)
		return n > 0 || err != nil
	})
}

// exitRecord converts a wait status into the exit record: the true code,
// or the signal (with Code 128+signal), never an invented 0 or -1.
func exitRecord(ws syscall.WaitStatus, werr error) journal.Exit {
	if werr != nil {
		return journal.Exit{Reason: journal.ReasonLost, Detail: fmt.Sprintf("wait for command: %v", werr)}
	}
	switch {
	case ws.Signaled():
		sig := int(ws.Signal())
		d := ws.Signal().String()
		if ws.CoreDump() {
			d += " (core dumped)"
		}
		return journal.Exit{Reason: journal.ReasonSignaled, Signal: sig, Code: 128 + sig, Detail: d}
	case ws.Exited():
		return journal.Exit{Reason: journal.ReasonExited, Code: ws.ExitStatus()}
	}
	return journal.Exit{Reason: journal.ReasonLost, Detail: fmt.Sprintf("unknown wait status %#x", uint32(ws))}
}

// pump copies one output stream into the journal until EOF (or EIO, the
// PTY's end), or until the drain window closes.
func (s *server) pump(o output) {
	defer s.pumps.Done()
	if o.f != s.master {
		// Closing the read end now makes a leftover holder's writes fail
		// with EPIPE. The master stays open until shutdown: it is stdin too.
		defer o.f.Close()
	}
	// The buffer is made once there is something to read (or EOF, or the
	// drain deadline): an idle session's shim never holds it, which is a
	// tenth of its private memory (docs/benchmarks.md, idle cost).
	awaitReadable(o.f)
	buf := make([]byte, pumpBuf)
	sweeping, swept := false, 0
	for {
		n, err := o.f.Read(buf)
		if n > 0 {
			s.writeJournal(o.stream, buf[:n])
			if sweeping {
				if swept += n; swept >= sweepMax {
					return
				}
				// The sweep waits sweepWindow for output, not counting
				// the time the journal write took (a full disk can hold
				// it for seconds while the pipe still has bytes).
				o.f.SetReadDeadline(time.Now().Add(sweepWindow))
			}
		}
		switch {
		case err == nil:
		case errors.Is(err, os.ErrDeadlineExceeded) && !sweeping:
			// The drain window closed: take what is already buffered.
			sweeping = true
			o.f.SetReadDeadline(time.Now().Add(sweepWindow))
		default:
			return // EOF, EIO (PTY hangup), or the sweep's end
		}
	}
}

// writeJournal appends p to the journal and never drops a byte: on a write
// failure (disk full) it records the error and retries with backoff, so the
// pump stops reading and the command blocks on its full pipe.
func (s *server) writeJournal(stream string, p []byte) {
	backoff := minBackoff
	failed := false
	for len(p) > 0 {
		n, err := s.jw.Load().Write(stream, p)
		p = p[n:]
		if err == nil {
			continue
		}
		failed = true
		s.retryWait(fmt.Sprintf("write journal %s: %v", stream, err), &backoff)
	}
	if failed {
		s.setWriteErr("")
	}
}

func (s *server) setWriteErr(msg string) {
	s.mu.Lock()
	s.writeErr = msg
	s.mu.Unlock()
}

// retryWait records msg, a failed journal write, as the session's write
// error and sleeps out *backoff before the next attempt, doubling *backoff
// up to maxBackoff.
func (s *server) retryWait(msg string, backoff *time.Duration) {
	s.setWriteErr(msg)
	time.Sleep(*backoff)
	*backoff = min(2**backoff, maxBackoff)
}

// finish publishes the exit record. When the journal cannot be finished
// (disk full), it retries, recovering the journal each time, until it can:
// an exit record is never skipped and never invented.
func (s *server) finish(rec journal.Exit) {
	jdir := filepath.Join(s.dir, JournalDir)
	backoff := minBackoff
	// A failed Finish closes the writer, which releases the journal's
	// lock: until Recover takes it again, readers see a dead writer without
	// an exit record and report the session lost. So wait for space with
	// the writer still open, and only then finish.
	for {
		err := probeSpace(jdir)
		if err == nil {
			break
		}
		s.retryWait(fmt.Sprintf("finish journal: %v", err), &backoff)
	}
	backoff = minBackoff
	for {
		jw := s.jw.Load()
		rec.Lengths = map[string]int64{}
		for _, st := range s.spec.Streams() {
			rec.Lengths[st] = jw.Len(st)
		}
		rec.Time = time.Now().UTC()
		err := jw.Finish(rec)
		if err == nil {
			break
		}
		s.retryWait(fmt.Sprintf("finish journal: %v", err), &backoff)
		nw, rerr := journal.Recover(jdir)
		if errors.Is(rerr, journal.ErrFinished) {
			if j, oerr := journal.Open(jdir); oerr == nil {
				if e, ok, _ := j.Exit(); ok {
					rec = e
				}
				j.Close()
			}
			break
		}
		if rerr == nil {
			s.jw.Store(nw)
		}
	}
	s.mu.Lock()
	s.exit, s.writeErr = &rec, ""
	s.mu.Unlock()
	close(s.done)
}

// finishSpace is what probeSpace asks for: far more than Finish writes (a
// few index pages and a small exit.json).
const finishSpace = 256 << 10

// finishInodes is the free inodes probeSpace asks for.
const finishInodes = 8

// probeSpace reports whether the journal's filesystem has finishSpace
// bytes and finishInodes inodes free for this process (root may use the
// reserved blocks). It asks statfs(2) rather than writing a scratch file:
// that cost 0.7 ms of every command's end (docs/benchmarks.md). A user or
// group quota does not show in statfs; the shim runs as root, which
// quotas do not limit unless configured to.
func probeSpace(jdir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(jdir, &st); err != nil {
		return fmt.Errorf("probe free space: %w", err)
	}
	free := st.Bavail
	if os.Geteuid() == 0 {
		free = st.Bfree
	}
	if free*uint64(st.Bsize) < finishSpace {
		return fmt.Errorf("probe free space: %w: %d bytes free, finishing needs %d", unix.ENOSPC, free*uint64(st.Bsize), finishSpace)
	}
	// Finishing creates files (exit.json's temporary name): inodes count
	// too, where the filesystem has a fixed number (Files 0: it has not).
	if st.Files > 0 && st.Ffree < finishInodes {
		return fmt.Errorf("probe free space: %w: %d inodes free, finishing needs %d", unix.ENOSPC, st.Ffree, finishInodes)
	}
	return nil
}

// shutdown stops serving: no new connections, idle connections end, and
// in-flight requests get their answers (every one can complete now that
// the exit record is published and nothing is left below the shim).
func (s *server) shutdown() {
	close(s.closing)
	s.ln.Close()
	os.Remove(s.sock)
	s.mu.Lock()
	for c := range s.conns {
		c.CloseRead() // an idle handler sees EOF; a busy one answers first
	}
	s.mu.Unlock()
	waited := make(chan struct{})
	// Owned by shutdown: it ends when every handler has returned.
	go func() { s.handlers.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(closeTimeout):
		s.mu.Lock()
		for c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		<-waited
	}
	s.stdinMu.Lock()
	if s.master != nil || !s.stdinClosed {
		s.stdin.Close()
	}
	s.stdinMu.Unlock()
}

func (s *server) accept() {
	defer s.handlers.Done()
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			return // listener closed by shutdown
		}
		s.mu.Lock()
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		select {
		case <-s.closing:
			c.CloseRead()
		default:
		}
		s.handlers.Add(1)
		go s.serveConn(c)
	}
}

func (s *server) serveConn(c *net.UnixConn) {
	defer s.handlers.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	var hdr [ctlHdrLen]byte
	var in, out []byte
	for {
		op, body, err := readMsg(c, &hdr, in)
		if err != nil {
			if errors.Is(err, errProto) {
				writeMsg(c, out, stError, errorBody(codeInvalid, err.Error()))
			}
			return
		}
		if cap(body) <= 64<<10 {
			in = body // keep small buffers only: an idle connection stays small
		}
		st, resp := s.handle(op, body)
		if out, err = writeMsg(c, out, st, resp); err != nil {
			return
		}
		if cap(out) > 64<<10 {
			out = nil
		}
	}
}

func (s *server) isExited() bool {
	select {
	case <-s.exited:
		return true
	default:
		return false
	}
}

func (s *server) handle(op byte, body []byte) (byte, []byte) {
	switch op {
	case opWrite:
		if len(body) == 0 {
			return stOK, nil
		}
		return s.writeStdin(body)
	case opCloseStdin:
		return s.closeStdin()
	case opResize:
		if len(body) != 4 {
			return stError, errorBody(codeInvalid, "resize wants rows and cols")
		}
		return s.resize(binary.BigEndian.Uint16(body), binary.BigEndian.Uint16(body[2:]))
	case opSignal:
		if len(body) != 4 {
			return stError, errorBody(codeInvalid, "signal wants a number")
		}
		sig := binary.BigEndian.Uint32(body)
		if sig == 0 || sig > 64 {
			return stError, errorBody(codeInvalid, fmt.Sprintf("no signal %d", sig))
		}
		if s.isExited() {
			return stExited, nil
		}
		if err := s.signalGroup(syscall.Signal(sig)); err != nil {
			if errors.Is(err, syscall.ESRCH) {
				return stExited, nil
			}
			return stError, errorBody(codeProvider, err.Error())
		}
		return stOK, nil
	case opTerminate:
		if len(body) != 8 {
			return stError, errorBody(codeInvalid, "terminate wants a grace")
		}
		return s.terminate(time.Duration(binary.BigEndian.Uint64(body)) * time.Millisecond)
	case opStatus:
		b, _ := json.Marshal(s.status())
		return stOK, b
	case opOffsetAt:
		return s.offsetAt(body)
	}
	return stError, errorBody(codeInvalid, fmt.Sprintf("unknown op %d", op))
}

// signalGroup signals the command's process group (the command is its
// session and group leader).
func (s *server) signalGroup(sig syscall.Signal) error {
	return syscall.Kill(-s.pid, sig)
}

func (s *server) writeStdin(p []byte) (byte, []byte) {
	if s.isExited() {
		return stExited, nil
	}
	s.stdinMu.Lock()
	defer s.stdinMu.Unlock()
	if s.stdinClosed {
		return stExited, []byte(codeClosed)
	}
	_, err := s.stdin.Write(p)
	if err == nil {
		if s.master != nil {
			s.atLineStart = p[len(p)-1] == '\n' || p[len(p)-1] == '\r'
		}
		return stOK, nil
	}
	if s.isExited() || errors.Is(err, os.ErrDeadlineExceeded) {
		return stExited, nil
	}
	if errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.EIO) {
		// The command closed its stdin. It is about to exit, usually.
		select {
		case <-s.exited:
			return stExited, nil
		case <-time.After(200 * time.Millisecond):
			return stExited, []byte(codeClosed)
		}
	}
	return stError, errorBody(codeProvider, err.Error())
}

// closeStdin delivers a real EOF once. Pipes: the write end is closed.
// TTY: the terminal's VEOF character (^D) is written at the start of a
// line, so the line discipline turns it into an end of file for the
// reader: once when the last byte written was a newline (or nothing was
// written), twice otherwise (the first ^D only ends the pending partial
// line). A terminal in raw mode has no EOF; the ^D is then a plain byte.
func (s *server) closeStdin() (byte, []byte) {
	if s.isExited() {
		return stExited, nil
	}
	s.stdinMu.Lock()
	defer s.stdinMu.Unlock()
	if s.stdinClosed {
		return stOK, nil
	}
	var err error
	if s.master != nil {
		c, _ := veofChar(s.master)
		eof := []byte{c}
		if !s.atLineStart {
			eof = append(eof, c)
		}
		_, err = s.master.Write(eof)
	} else {
		err = s.stdin.Close()
	}
	if err != nil && s.isExited() {
		return stExited, nil
	}
	s.stdinClosed = true
	if err != nil {
		return stError, errorBody(codeProvider, err.Error())
	}
	return stOK, nil
}

func (s *server) resize(rows, cols uint16) (byte, []byte) {
	if s.master == nil {
		return stError, errorBody(codeInvalid, "not a TTY session")
	}
	if rows == 0 || cols == 0 {
		return stError, errorBody(codeInvalid, "rows and cols must be at least 1")
	}
	if s.isExited() {
		return stExited, nil
	}
	// TIOCSWINSZ on the master also sends SIGWINCH to the foreground group.
	if err := withFd(s.master, func(fd int) error { return setWinsize(fd, rows, cols) }); err != nil {
		return stError, errorBody(codeProvider, err.Error())
	}
	return stOK, nil
}

// terminate stops everything the session started: SIGTERM to the
// command's group and to the group of every other process below the shim,
// SIGKILL after grace to every one still alive, until none is left
// (killTree). It answers with the exit record once it is published. On a
// session whose command has already ended it stops the lingering
// descendants the same way and answers the record.
func (s *server) terminate(grace time.Duration) (byte, []byte) {
	signalled := 0
	if !s.isExited() {
		s.stopAsked.Store(true)
		s.signalGroup(syscall.SIGTERM)
		signalled = s.pid // the command leads its own group
	}
	s.killTree(grace, signalled)
	// Wait for the record, unless the command has ended and the record
	// cannot be written (disk full): that answer is write_failed, at once
	// rather than when the caller gives up. The shim keeps retrying; the
	// record (with Terminated) is published once there is space.
	tick := time.NewTicker(writeFailedPoll)
	defer tick.Stop()
	stuck := 0
	for {
		select {
		case <-s.done:
			s.mu.Lock()
			b, _ := json.Marshal(s.exit)
			s.mu.Unlock()
			return stOK, b
		case <-tick.C:
		}
		s.mu.Lock()
		werr := s.writeErr
		s.mu.Unlock()
		if !s.isExited() || werr == "" {
			stuck = 0
			continue
		}
		if stuck++; stuck >= writeFailedAfter {
			return stError, errorBody(codeWriteFailed, "the command has ended but its exit record cannot be written: "+werr)
		}
	}
}

// A terminate answers write_failed once the command has ended and the
// journal has failed writes for writeFailedAfter polls in a row, so a
// single transient failure does not turn into an error.
const (
	writeFailedPoll  = 50 * time.Millisecond
	writeFailedAfter = 4
)

func (s *server) status() Status {
	st := Status{ID: s.spec.ID, State: StateRunning, ShimPID: os.Getpid(), PID: s.pid, TTY: s.spec.TTY, StartedAt: s.at}
	st.Descendants = s.countDescendants()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.exit != nil {
		e := *s.exit
		st.State, st.Exit = StateExited, &e
	}
	st.WriteError = s.writeErr
	return st
}

func (s *server) offsetAt(body []byte) (byte, []byte) {
	var req offsetReq
	if err := json.Unmarshal(body, &req); err != nil {
		return stError, errorBody(codeInvalid, "offset_at: "+err.Error())
	}
	t, err := time.Parse(time.RFC3339Nano, req.Time)
	if err != nil {
		return stError, errorBody(codeInvalid, "offset_at: "+err.Error())
	}
	var off int64
	select {
	case <-s.done:
		off, err = offsetFromDisk(s.dir, req.Stream, t)
	default:
		off, err = s.jw.Load().OffsetAt(req.Stream, t)
		if errors.Is(err, journal.ErrFinished) || errors.Is(err, journal.ErrClosed) {
			<-s.done
			off, err = offsetFromDisk(s.dir, req.Stream, t)
		}
	}
	if err != nil {
		code := codeProvider
		if errors.Is(err, journal.ErrUnknownStream) {
			code = codeInvalid
		}
		return stError, errorBody(code, err.Error())
	}
	return stOK, binary.BigEndian.AppendUint64(nil, uint64(off))
}

func offsetFromDisk(dir, stream string, t time.Time) (int64, error) {
	j, err := journal.Open(filepath.Join(dir, JournalDir))
	if err != nil {
		return 0, err
	}
	defer j.Close()
	return j.OffsetAt(stream, t)
}
