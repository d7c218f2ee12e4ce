package sessiondir

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/agentrunner/runner/journal"
	"github.com/agentrunner/runner/wire"
)

// Info is a session as runner-shim's status and list report it: its
// Status, what it runs and how many bytes each stream holds now. It is
// read from the session directory (spec.json and the segment files), never
// from bbolt, so it costs no round trip to the shim.
type Info struct {
	Status
	Argv []string `json:"argv"`
	Cwd  string   `json:"cwd,omitempty"`
	// Stdout and Stderr are the bytes each stream holds now (its end
	// offset); Stderr is 0 for a TTY session.
	Stdout int64 `json:"stdout"`
	Stderr int64 `json:"stderr"`
}

// Describe completes st, the status of the session in dir, with its argv
// and current stream lengths. It returns ErrNoSession when dir holds no
// session.
func Describe(dir string, st Status) (Info, error) {
	spec, err := ReadSpec(dir)
	if err != nil {
		return Info{}, fmt.Errorf("describe: %w", err)
	}
	in := Info{Status: st, Argv: spec.Argv, Cwd: spec.Dir}
	j, err := journal.Open(filepath.Join(dir, JournalDir))
	if err != nil {
		return Info{}, fmt.Errorf("describe %s: %w", dir, err)
	}
	defer j.Close()
	for _, s := range j.Streams() {
		_, end, err := j.Bounds(s)
		if err != nil {
			return Info{}, fmt.Errorf("describe %s: %w", dir, err)
		}
		switch s {
		case "stdout":
			in.Stdout = end
		case "stderr":
			in.Stderr = end
		}
	}
	// An exited session's final lengths are the record's (equal to the
	// files' ends, unless retention or a recovery says otherwise).
	if st.Exit != nil {
		if n, ok := st.Exit.Lengths["stdout"]; ok {
			in.Stdout = n
		}
		if n, ok := st.Exit.Lengths["stderr"]; ok {
			in.Stderr = n
		}
	}
	return in, nil
}

// ListInfo returns the Info of every session directly under root in start
// order (the start time, then the id). Directories that hold no started
// session are skipped; it reads from disk only.
func ListInfo(root string) ([]Info, error) {
	list, err := List(root)
	if err != nil {
		return nil, err
	}
	out := make([]Info, 0, len(list))
	for _, st := range list {
		in, err := Describe(filepath.Join(root, st.ID), st)
		if errors.Is(err, ErrNoSession) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list sessions: %w", err)
		}
		out = append(out, in)
	}
	slices.SortStableFunc(out, func(a, b Info) int {
		if c := a.StartedAt.Compare(b.StartedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}

// SameRequest reports whether two specs ask for the same session, the
// rule runnerd applies to a spawn that names an existing session id:
// the same argv, environment, working directory, user, terminal and its
// size, network namespace and retention.
func SameRequest(a, b Spec) bool {
	return a.ID == b.ID && slices.Equal(a.Argv, b.Argv) && slices.Equal(a.Env, b.Env) && a.Dir == b.Dir &&
		a.User == b.User && a.TTY == b.TTY && a.Rows == b.Rows && a.Cols == b.Cols &&
		a.NetNS == b.NetNS && a.RetainBytes == b.RetainBytes && a.StdinClosed == b.StdinClosed
}

// ReadSpec reads the spec of the session in dir. It returns ErrNoSession
// when dir holds none.
func ReadSpec(dir string) (Spec, error) {
	var spec Spec
	err := ReadJSON(filepath.Join(dir, SpecFile), &spec)
	if errors.Is(err, fs.ErrNotExist) {
		return Spec{}, fmt.Errorf("read spec %s: %w", dir, ErrNoSession)
	}
	if err != nil {
		return Spec{}, fmt.Errorf("read spec %s: %w", dir, err)
	}
	return spec, nil
}

// sessionExists reports whether dir holds a session (its spec), started
// or starting.
func sessionExists(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, SpecFile))
	return err == nil
}

// Prune removes the session directories under root whose exit record is
// older than age at now and whose shim is gone (no control socket): the
// one-shot sessions a driver's execs leave. A running session, a lost one
// without a record, and one whose shim lingers for descendants are kept.
// It returns the first error, after trying every session.
func Prune(root string, age time.Duration, now time.Time) error {
	list, err := List(root)
	if err != nil {
		return err
	}
	var first error
	for _, st := range list {
		if st.Exit == nil || now.Sub(st.Exit.Time) < age {
			continue
		}
		dir := filepath.Join(root, st.ID)
		if _, err := os.Stat(filepath.Join(dir, SocketFile)); !errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err := os.RemoveAll(dir); err != nil && first == nil {
			first = fmt.Errorf("prune %s: %w", st.ID, err)
		}
	}
	return first
}

// ToWireMarks turns a journal Marks answer into wire.Marks.
func ToWireMarks(stream string) func([]journal.Mark, int64, time.Duration, error) (wire.Marks, error) {
	return func(ms []journal.Mark, next int64, interval time.Duration, err error) (wire.Marks, error) {
		if err != nil {
			return wire.Marks{}, err
		}
		out := wire.Marks{Stream: stream, Marks: make([]wire.Mark, len(ms)), GranularityMS: interval.Milliseconds()}
		for i, m := range ms {
			out.Marks[i] = wire.Mark{Offset: m.Offset, Time: m.Time.UTC()}
		}
		if next >= 0 {
			out.Next = &next
		}
		return out, nil
	}
}

func MarksFromDisk(dir, stream string, from int64) (wire.Marks, error) {
	j, err := journal.Open(filepath.Join(dir, JournalDir))
	if err != nil {
		return wire.Marks{}, err
	}
	defer j.Close()
	return ToWireMarks(stream)(j.Marks(stream, from, wire.MaxMarks))
}

func OffsetFromDisk(dir, stream string, t time.Time) (int64, error) {
	j, err := journal.Open(filepath.Join(dir, JournalDir))
	if err != nil {
		return 0, err
	}
	defer j.Close()
	return j.OffsetAt(stream, t)
}
