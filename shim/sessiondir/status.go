package sessiondir

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/agentrunner/runner/journal"
)

// A session's status read from its directory without its shim.

// Status describes a session.
type Status struct {
	ID    string `json:"id"`
	State string `json:"state"` // "running" | "exited" | "lost"
	// ShimPID and PID are the shim's and the command's process ids (0 if
	// unknown).
	ShimPID int  `json:"shim_pid,omitempty"`
	PID     int  `json:"pid,omitempty"`
	TTY     bool `json:"tty"`
	// Exit is the exit record once State is "exited".
	Exit *journal.Exit `json:"exit,omitempty"`
	// WriteError is set while the shim cannot write the journal (the
	// command is then backpressured); the contract's code is write_failed.
	WriteError string    `json:"write_error,omitempty"`
	StartedAt  time.Time `json:"started_at"`
	// Descendants is the number of live processes the session started
	// besides the command itself (its children, and orphans the shim
	// adopted as their subreaper). After the exit record the shim lingers
	// while it is not 0, and terminate stops them. It is known only from
	// a live shim: 0 when read from disk (a shim that is gone keeps none),
	// -1 when the shim cannot read /proc.
	Descendants int `json:"descendants,omitempty"`
}

// Started is started.json.
type Started struct {
	ShimPID   int       `json:"shim_pid"`
	PID       int       `json:"pid"`
	StartedAt time.Time `json:"started_at"`
}

var (
	// ErrExited is returned by WriteStdin, CloseStdin, Resize and Signal
	// when the command has ended, including when the shim is gone but the
	// exit record exists. It is an answer, not a transport failure.
	ErrExited = errors.New("command exited")
	// ErrStdinClosed is returned by WriteStdin after CloseStdin. It matches
	// ErrExited too (errors.Is), as the contract's command_exited does.
	ErrStdinClosed error = stdinClosedError{}
	// ErrLost is returned when the shim is gone without an exit record: the
	// command's end is unknown (it may even still run, unsupervised).
	ErrLost = errors.New("session lost: shim gone without an exit record")
	// ErrNoSession is returned when a directory holds no started session.
	ErrNoSession = errors.New("no such session")
	// ErrExists is returned by Start when the directory already holds a
	// session.
	ErrExists = errors.New("session already exists")
	// ErrInvalid is returned for a malformed Spec or request (an empty argv,
	// a bad id, resize of a pipes session, a socket path that is too long).
	ErrInvalid = errors.New("invalid request")
	// ErrUnavailable is returned when the shim cannot be reached although
	// the session still runs by every sign on disk: retry.
	ErrUnavailable = errors.New("shim unavailable")
	// ErrWriteFailed is returned by Terminate's wait when the shim reports
	// that it cannot write the journal.
	ErrWriteFailed = errors.New("journal write failed")
	// ErrStdinGap is returned by WriteStdinAt when its offset is past the
	// bytes the command's stdin got: nothing was written. It matches
	// ErrInvalid too.
	ErrStdinGap error = stdinGapError{}
	// ErrNoStdinOffsets is returned by WriteStdinAt and StdinCount when
	// the shim predates offset writes (it was started by an older
	// runnerd and outlived it).
	ErrNoStdinOffsets = errors.New("shim predates stdin offsets")
)

type stdinGapError struct{}

func (stdinGapError) Error() string        { return "stdin offset gap" }
func (stdinGapError) Is(target error) bool { return target == ErrInvalid }

type stdinClosedError struct{}

func (stdinClosedError) Error() string        { return "stdin closed" }
func (stdinClosedError) Is(target error) bool { return target == ErrExited }

// ReadStatus reads a session's status from its directory without the
// control socket: "exited" with the exit record when the journal has one,
// "running" while the shim (the journal's writer) is alive, "lost"
// otherwise. It returns ErrNoSession for a directory without a started
// session.
func ReadStatus(dir string) (Status, error) {
	st, err := readStatus(dir)
	if err != nil {
		return Status{}, fmt.Errorf("read status %s: %w", dir, err)
	}
	return st, nil
}

func readStatus(dir string) (Status, error) {
	// A session is started once both files exist (started.json is
	// written after the command started).
	read := func(name string, v any) error {
		err := ReadJSON(filepath.Join(dir, name), v)
		if errors.Is(err, fs.ErrNotExist) {
			return ErrNoSession
		}
		return err
	}
	var spec Spec
	if err := read(SpecFile, &spec); err != nil {
		return Status{}, err
	}
	var sd Started
	if err := read(StartedFile, &sd); err != nil {
		return Status{}, err
	}
	st := Status{ID: spec.ID, TTY: spec.TTY, ShimPID: sd.ShimPID, PID: sd.PID, StartedAt: sd.StartedAt}
	j, err := journal.Open(filepath.Join(dir, JournalDir))
	if err != nil {
		return Status{}, err
	}
	defer j.Close()
	// Liveness first, exit second: a writer that finishes between the two
	// checks then reads as exited, never as lost.
	alive, err := j.WriterAlive()
	if err != nil {
		return Status{}, err
	}
	e, ok, err := j.Exit()
	if err != nil {
		return Status{}, err
	}
	switch {
	case ok:
		st.State, st.Exit = StateExited, &e
	case alive:
		st.State = StateRunning
	default:
		st.State = StateLost
	}
	return st, nil
}

func ReadJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decode %s: %w", filepath.Base(path), err)
	}
	return nil
}

func SocketPath(dir string) (string, error) {
	p := filepath.Join(dir, SocketFile)
	if len(p) > maxSocketPath {
		return "", fmt.Errorf("%w: socket path %s is %d bytes, the unix limit is %d: use a shorter session directory", ErrInvalid, p, len(p), maxSocketPath)
	}
	return p, nil
}

// List returns the status of every session directory directly under root,
// ordered by name. Directories that hold no started session are skipped.
func List(root string) ([]Status, error) {
	ents, err := os.ReadDir(root)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("list sessions in %s: %w", root, err)
	}
	var out []Status
	for _, e := range ents {
		if !e.IsDir() || !ValidID(e.Name()) {
			continue
		}
		st, err := ReadStatus(filepath.Join(root, e.Name()))
		if errors.Is(err, ErrNoSession) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list sessions: %w", err)
		}
		out = append(out, st)
	}
	return out, nil
}
