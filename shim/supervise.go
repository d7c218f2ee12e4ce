package shim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentrunner/runner/cgroup/oom"
	"github.com/agentrunner/runner/internal/atomicfile"
	"github.com/agentrunner/runner/journal"
	"github.com/agentrunner/runner/shim/internal/proto"
	"github.com/agentrunner/runner/shim/sessiondir"
)

// start starts spec's command in the prepared s: on success the command
// runs and started.json is written. gate, if not nil, is called once all
// but the command's fork/exec is done; an error from it starts nothing and
// is returned. On failure nothing is left running; the caller undoes the
// rest.
func (s *server) start(spec sessiondir.Spec, gate func() error) (err error) {
	return s.startWith(spec, gate, nil)
}

// startWith is start with a helper started ahead (nil: none), used when
// the command needs one. A helper not used is killed (on success the
// reaper reaps it) or, on failure, killed and reaped.
func (s *server) startWith(spec sessiondir.Spec, gate func() error, ahead *nsexecAhead) (err error) {
	if tracing() {
		id := spec.ID
		traceSession.Store(&id)
		defer span("start (to exec ack)", time.Now())
	}
	defer func() {
		if err != nil {
			ahead.discard()
		} else {
			ahead.kill()
		}
	}()
	s.spec = spec
	if s.budget, err = openBudget(spec); err != nil { // budget.go
		return err
	}
	var childEnds []*os.File // closed in the shim once the child has them
	defer func() {
		for _, f := range childEnds {
			f.Close()
		}
	}()

	var cred *syscall.Credential
	if s.spec.User != "" && s.spec.Pod == nil { // a pod's user is taken inside it (pod.go)
		if cred, err = sessiondir.Credential(s.spec.User); err != nil {
			return &proto.CommandError{Err: err}
		}
	}
	path := s.spec.Argv[0] // in a pod the helper looks it up, inside (pod.go)
	if s.spec.Pod == nil {
		if path, err = lookPathAs(cred, s.spec.Argv[0], s.spec.Env, s.spec.Dir); err != nil { // lookas.go: as the user, not root
			return fmt.Errorf("start %s: %w", s.spec.Argv[0], &proto.CommandError{Err: err})
		}
	}
	cmd := &exec.Cmd{Path: path, Args: s.spec.Argv, Env: s.spec.Env, Dir: s.spec.Dir}
	if cmd.Env == nil {
		cmd.Env = []string{} // never the shim's own environment
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: cred}
	if s.spec.TTY {
		rows, cols := s.spec.Rows, s.spec.Cols
		if rows == 0 {
			rows = 24
		}
		if cols == 0 {
			cols = 80
		}
		master, slave, err := openPTY(rows, cols, s.spec.Pod)
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
		if s.spec.MergeStderr {
			// One pipe for both: the order of the command's writes is
			// the pipe's, so the stdout stream holds it. The stderr
			// pipe stays open and empty, so its stream ends at 0.
			cmd.Stderr = pipes[1][1]
		}
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
	// Called once just before the command can run: a helper started
	// ahead does its steps (joining cgroups, the mount namespace, the
	// user switch) while the gate waits for runnerd's commit, and
	// executes the command only after.
	before := func() error {
		if gate != nil {
			t := spanStart()
			err := gate()
			span("gate (runnerd's commit)", t)
			if err != nil {
				return &gateError{err}
			}
		}
		if len(s.spec.Cgroups) > 0 {
			// The baseline of the honest OOM exit (oomKilled): read before
			// the command can be killed, so a rise is a kill in its life.
			if n, err := oom.Kills(s.spec.Cgroups); err == nil {
				s.oomBase, s.oomSeen = n, true
				s.kmsg, _ = oom.OpenKernelLog() // nil: no kill is attributed (oomKilled)
			}
		}
		s.at = time.Now().UTC()
		return nil
	}
	if err := execCommand(cmd, s.spec, ahead, before); err != nil {
		var ge *gateError
		if errors.As(err, &ge) {
			return ge.err
		}
		return fmt.Errorf("start %s: %w", s.spec.Argv[0], err)
	}
	s.cmd, s.pid = cmd, cmd.Process.Pid
	s.reap = newReaper(s.pid)
	if s.spec.StdinClosed {
		s.stdin.Close() // the command reads EOF, as after close-stdin
		s.stdinClosed = true
	}
	b, _ := json.Marshal(sessiondir.Started{ShimPID: os.Getpid(), PID: s.pid, StartedAt: s.at})
	if err := s.startedFile.publish(s.dir, b); err != nil {
		syscall.Kill(-s.pid, syscall.SIGKILL)
		cmd.Process.Wait() // the Process of a helper started ahead is not cmd's own start
		return fmt.Errorf("write %s: %w", sessiondir.StartedFile, err)
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
	// Told the command runs, and that it ended once the exit record is
	// published (the program's Hooks; none for runnerd's shims).
	ended := s.hooks.running(s.spec)
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
			if err := atomicfile.SyncDir(s.syncParent); err != nil {
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
					s.signalTree(syscall.SIGTERM, skip)
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
	var note string
	rec.OOMKilled, note = s.oomKilled(rec)
	if note != "" {
		rec.Detail += "; " + note
	}
	s.kmsg.Close()
	// Read after the reap: a terminate that asked before the command ended
	// has set it by now (it sets it before signalling).
	if s.stopAsked.Load() && rec.Reason != journal.ReasonLost {
		rec.Terminated = true
	}
	s.finish(rec)
	ended()

	// Linger: a descendant that outlived the command (a daemon it
	// started, a double fork) is reparented to the shim, which stays its
	// reaper, answers status (with the count) and terminate (which kills
	// them) until the last one is gone.
	<-s.reap.allDone
	s.lingerInLeaf()
	signal.Stop(sigs)
	<-fwdDone
	s.shutdown()
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

// oomKilled reports whether the command, which ended as rec says, was
// killed by the kernel's OOM killer. It is true only when the evidence
// names the command: it died of SIGKILL, the shim sent it none (the
// signal op, terminate's grace: s.killSent, s.stopAsked), the OOM kill
// counter of its cgroups rose during its life, and the kernel log names
// its pid as the OOM killer's victim. The counter alone is not enough: a
// command shares its cgroup with its children, so a child's OOM kill
// followed by a SIGKILL of the command (its own kill -9 $$, or one from
// outside runnerd) would read the same. The kernel logs the victim right
// after it sends the signal, which a reaper can beat: without the record
// the log is read again after short pauses (only for SIGKILL exits of
// sessions whose counter rose). Where the counter rose but the log is
// not readable or does not name the command, oomKilled is false and the
// note (for the exit record's detail) says a kill happened whose victim
// is not known to be the command.
func (s *server) oomKilled(rec journal.Exit) (bool, string) {
	if !s.oomSeen || rec.Reason != journal.ReasonSignaled || rec.Signal != int(syscall.SIGKILL) {
		return false, ""
	}
	if s.killSent.Load() || s.stopAsked.Load() {
		return false, "" // the shim's own kill
	}
	rose := false
	for try := 0; try < 10; try++ {
		if try > 0 {
			time.Sleep(20 * time.Millisecond)
		}
		if !rose {
			n, err := oom.Kills(s.spec.Cgroups)
			rose = err == nil && n > s.oomBase
			if !rose && try >= 1 {
				return false, "" // no OOM kill in its cgroup: a plain SIGKILL
			}
			if !rose {
				continue
			}
		}
		if s.kmsg == nil {
			return false, "the session's cgroup counted an OOM kill, but the kernel log that names its victim is not readable"
		}
		if ok, err := s.kmsg.KilledPID(s.pid); ok {
			return true, ""
		} else if err != nil {
			return false, "the session's cgroup counted an OOM kill; reading the kernel log that names its victim failed: " + err.Error()
		}
	}
	return false, "the session's cgroup counted an OOM kill, but the kernel log does not name the command as its victim (another process of the session was killed)"
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

// writeJournal appends p to the journal and never drops a byte silently:
// on a write failure (disk full, a disk budget reached) it records the
// error and retries with backoff, so the pump stops reading and the
// command blocks on its full pipe. The one exception is a session that was
// asked to stop and whose command has ended (giveUp): what its journal
// cannot take then is counted into the exit record (unstored_bytes, with
// the error in its detail) instead of keeping the session from ending,
// because waiting could last until an operator frees space by hand.
func (s *server) writeJournal(stream string, p []byte) {
	backoff := minBackoff
	failed := false
	// The command's end may change what to do (giveUp): a wait ends
	// there rather than after up to maxBackoff, once (exited stays closed).
	wake := s.exited
	for len(p) > 0 {
		n, err := s.writeBudgeted(stream, p) // budget.go
		p = p[n:]
		if err == nil {
			continue
		}
		failed = true
		if s.giveUp() {
			s.mu.Lock()
			s.unstored += int64(len(p))
			s.unstoredErr = err.Error()
			s.unstoredCap = s.unstoredCap || errors.Is(err, ErrJournalCap)
			s.writeErr = "" // not waiting any more: the exit record is next
			s.mu.Unlock()
			return
		}
		if s.isExited() {
			// A terminate may come at any time now: be ready for it.
			wake = nil
			backoff = min(backoff, exitedBackoff)
		}
		s.retryWaitOr(fmt.Sprintf("write journal %s: %v", stream, err), &backoff, wake)
	}
	if failed {
		s.setWriteErr("")
	}
}

// giveUp reports whether output that cannot be stored may be given up:
// a terminate (or a suspend or destroy, which terminate) was asked and the
// command has ended.
func (s *server) giveUp() bool {
	return s.stopAsked.Load() && s.isExited()
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
	s.retryWaitOr(msg, backoff, nil)
}

// retryWaitOr is retryWait that also ends when wake is closed (a nil
// wake never does).
func (s *server) retryWaitOr(msg string, backoff *time.Duration, wake <-chan struct{}) {
	s.setWriteErr(msg)
	t := time.NewTimer(*backoff)
	defer t.Stop()
	select {
	case <-t.C:
	case <-wake:
	}
	*backoff = min(2**backoff, maxBackoff)
}

// finish publishes the exit record. When the journal cannot be finished
// (disk full), it retries, recovering the journal each time, until it can:
// an exit record is never skipped and never invented.
func (s *server) finish(rec journal.Exit) {
	jdir := filepath.Join(s.dir, sessiondir.JournalDir)
	backoff := minBackoff
	// A failed Finish closes the writer, which releases the journal's
	// lock: until Recover takes it again, readers see a dead writer without
	// an exit record and report the session lost. So wait for space with
	// the writer still open, and only then finish.
	for {
		// A journal that holds its reserve needs no probe: Finish frees
		// the reserve before it writes, and the reserve is what it writes.
		if s.jw.Load().HasReserve() {
			break
		}
		err := probeSpace(jdir)
		if err == nil || s.dirGone() {
			break
		}
		s.retryWait(fmt.Sprintf("finish journal: %v", err), &backoff)
	}
	s.mu.Lock()
	if s.unstored > 0 {
		rec.UnstoredBytes = s.unstored
		rec.Cause = journal.CauseDiskFull
		if s.unstoredCap {
			rec.Cause = journal.CauseDiskBudget
		}
		d := fmt.Sprintf("%d bytes of output were not stored after the command ended: %s", s.unstored, s.unstoredErr)
		if rec.Detail != "" {
			d = rec.Detail + "; " + d
		}
		rec.Detail = d
	}
	s.mu.Unlock()
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
		if s.dirGone() {
			// Nobody can read a record here any more: waiting for one
			// to be written would keep the shim alive for good.
			fmt.Fprintf(os.Stderr, "runner-shim: session directory %s removed before the exit record (%v): exit %+v not published\n", s.dir, err, rec)
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

// dirGone reports whether the session's directory was removed under the
// running shim (its sandbox's state deleted by hand, or a test's temporary
// directory cleaned up): then no reader can ever see an exit record, and
// finish stops retrying one instead of keeping the shim alive for good.
func (s *server) dirGone() bool {
	_, err := os.Stat(s.dir)
	return errors.Is(err, fs.ErrNotExist)
}

// exitedBackoff caps the wait between journal write retries once the
// command has ended, so that a terminate then gives the output up
// (giveUp) in well under the terminate's write_failed answer.
const exitedBackoff = 50 * time.Millisecond

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

// gateError carries start's gate error through execCommand unchanged.
type gateError struct{ err error }

func (e *gateError) Error() string { return e.err.Error() }
