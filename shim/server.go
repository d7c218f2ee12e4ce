package shim

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentrunner/runner/cgroup/oom"
	"github.com/agentrunner/runner/journal"
	"github.com/agentrunner/runner/shim/sessiondir"
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
	dir   string
	spec  sessiondir.Spec
	hooks Hooks // what the program adds to the session's life (hooks.go)
	ln    *net.UnixListener
	sock  string
	cmd   *exec.Cmd
	pid   int
	at    time.Time // when the command was started

	jw atomic.Pointer[journal.Writer] // replaced only by Finish retries

	master *os.File // PTY master (TTY mode), nil otherwise
	stdin  *os.File // where stdin bytes go: the pipe's write end, or master
	outs   []output

	// stdinTurn serializes stdin writes and close, and guards the fields
	// below: whoever sends into it (capacity 1) holds the turn until it
	// receives back. A channel rather than a mutex, so a write whose
	// caller has gone stops waiting for its turn (writeStdin). It is never
	// held by resize, signal, terminate or status.
	stdinTurn   chan struct{}
	stdinClosed bool
	// stdinBytes counts the bytes written to the command's stdin by every
	// write (acknowledged or abandoned); written under stdinTurn, read
	// without it. It is what an offset write (opWriteAt) is checked
	// against, and it lives as long as the command, across runnerd's
	// restarts.
	stdinBytes  atomic.Int64
	atLineStart bool // TTY: the last stdin byte was '\n' (or none yet)

	exited  chan struct{} // closed once the child is reaped
	done    chan struct{} // closed once the exit record is published
	closing chan struct{} // closed when shutdown starts: no new connections

	// reap owns every wait of the process (see reaper.go); it runs from
	// run until no descendant is left.
	reap *reaper

	// budget is the sandbox's shared journal budget (Spec.JournalBudget),
	// nil without one; set by start (budget.go).
	budget *journalBudget
	// stopAsked is set by the terminate op before it signals the command:
	// the exit record of a command that ends after it says Terminated.
	stopAsked atomic.Bool
	// oomBase is the OOM kill count of Spec.Cgroups read just before the
	// command started; oomSeen says it could be read (a memory controller
	// is among them). Written by start, read by run after the reap.
	oomBase uint64
	oomSeen bool
	// kmsg is the kernel log opened just before the command started,
	// where the OOM killer names its victim (oomKilled); nil where it is
	// not readable. Written by start, read and closed by run.
	kmsg *oom.KernelLog
	// killSent is set when the shim itself sends the command SIGKILL (the
	// signal op, or terminate's grace): a SIGKILL exit after it is that
	// kill, never an OOM kill.
	killSent atomic.Bool

	// mu guards the fields below.
	mu       sync.Mutex
	exit     *journal.Exit
	writeErr string
	// unstored counts the output bytes a terminated session's journal
	// could not take after its command ended (writeJournal gives them up
	// rather than keep the session from ending); unstoredErr is the write
	// error that cost them. Both go into the exit record.
	unstored    int64
	unstoredErr string
	unstoredCap bool // the journal budget refused it (ErrJournalCap)
	conns       map[*net.UnixConn]struct{}

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
func newServer(dir string, hooks Hooks) (*server, error) {
	var spec sessiondir.Spec
	if err := sessiondir.ReadJSON(filepath.Join(dir, sessiondir.SpecFile), &spec); err != nil {
		return nil, fmt.Errorf("read spec: %w", err)
	}
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	// DeferCreateSync: the journal's creation is made durable at its first
	// sync point, not before the readiness report (see journal's doc).
	s, err := prepare(dir, journalOptions(spec, true))
	if err != nil {
		return nil, err
	}
	s.hooks = hooks
	if err := s.start(spec, nil); err != nil {
		s.undo()
		return nil, err
	}
	return s, nil
}

// journalOptions is the journal a session of spec needs.
func journalOptions(spec sessiondir.Spec, deferSync bool) journal.Options {
	return journal.Options{Streams: spec.Streams(), RetainBytes: spec.RetainBytes, DeferCreateSync: deferSync}
}
