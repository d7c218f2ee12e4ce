package shim

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/agentrunner/runner/shim/sessiondir"
	"golang.org/x/sys/unix"
)

// The sandbox's journal budget: every shim of a sandbox's sessions shares
// one 8-byte file (Spec.JournalBudget) holding the bytes their journals
// hold together, mapped MAP_SHARED and changed only by atomic operations
// on the mapping, so concurrent shims (separate processes) never together
// pass Spec.JournalCap. runnerd makes the file (counting what the
// sandbox's journals held before), and subtracts a session's bytes when
// it deletes the session.
//
// A write takes what fits of its bytes from the budget before it reaches
// the journal, and gives back what the journal did not take: the count
// errs on the full side, never the empty one. Once the cap is reached the
// session is ended (terminate, at once) and what the command wrote past
// the cap is not stored: the exit record counts it (unstored_bytes) and
// names the cap in its detail; every byte stored before stays readable.

// ErrJournalCap is the write error of output past the sandbox's journal
// cap.
var ErrJournalCap = errors.New("the sandbox's journal cap is reached")

// journalBudget is a mapped budget file. Safe for concurrent use.
type journalBudget struct {
	used *int64 // the mapped counter
	cap  int64
	once sync.Once // the session is ended once
}

// openBudget maps spec's budget file; nil without one.
func openBudget(spec sessiondir.Spec) (*journalBudget, error) {
	if spec.JournalBudget == "" {
		return nil, nil
	}
	f, err := os.OpenFile(spec.JournalBudget, os.O_RDWR|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("open journal budget: %w", err)
	}
	defer f.Close() // the mapping stays
	if fi, err := f.Stat(); err != nil || fi.Size() < 8 {
		return nil, fmt.Errorf("journal budget %s: not an 8-byte counter: %w", spec.JournalBudget, sessiondir.ErrInvalid)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, 8, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map journal budget: %w", err)
	}
	// The shim's life: the mapping goes with the process.
	return &journalBudget{used: (*int64)(unsafe.Pointer(&mem[0])), cap: spec.JournalCap}, nil
}

// take takes up to n bytes from the budget and returns how many.
func (b *journalBudget) take(n int64) int64 {
	for {
		cur := atomic.LoadInt64(b.used)
		free := b.cap - cur
		if free <= 0 {
			return 0
		}
		got := min(n, free)
		if atomic.CompareAndSwapInt64(b.used, cur, cur+got) {
			return got
		}
	}
}

// give returns n bytes to the budget.
func (b *journalBudget) give(n int64) {
	if n > 0 {
		atomic.AddInt64(b.used, -n)
	}
}

// writeBudgeted writes p to the journal within the sandbox's journal
// budget: what fits is written; past the cap it answers ErrJournalCap
// and ends the session (once).
func (s *server) writeBudgeted(stream string, p []byte) (int, error) {
	b := s.budget
	if b == nil {
		return s.jw.Load().Write(stream, p)
	}
	got := b.take(int64(len(p)))
	n := 0
	var err error
	if got > 0 {
		n, err = s.jw.Load().Write(stream, p[:got])
		b.give(got - int64(n))
	}
	if err == nil && n < len(p) {
		err = fmt.Errorf("%w (%d bytes)", ErrJournalCap, b.cap)
		b.once.Do(func() {
			// terminate answers once the exit record is published, which
			// needs this pump to end: not on the pump's goroutine.
			go s.terminate(0)
		})
	}
	return n, err
}
