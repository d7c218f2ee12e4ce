package sessions

// The journal cap: the journals of one sandbox's sessions, running or
// ended until deleted, hold at most Config.SandboxJournalBytes. The count
// is one 8-byte file per sandbox incarnation (STATE/budgets/NAME.INC) that
// every shim of the sandbox maps and changes atomically as it writes
// (shim/budget.go), so concurrent sessions never together pass it; a
// session whose output does not fit is ended by its shim, its exit naming
// the cap, every byte stored before readable. runnerd makes the file at
// the sandbox's first spawn under the cap (counting what its journals
// hold already), refuses a spawn once the count reached the cap (409
// invalid, detail journal_cap), and subtracts a session's bytes when it
// deletes the session.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/agentrunner/runner/daemon/apierr"
	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/internal/atomicfile"
	"github.com/agentrunner/runner/shim/sessiondir"
	"github.com/agentrunner/runner/wire"
)

// budgetPath is sb's journal budget file.
func (s *Manager) budgetPath(sb registry.Sandbox) string {
	return filepath.Join(s.cfg.StateDir, "budgets", sb.Name+"."+sb.Incarnation)
}

// journalHeld is what session ss's journal counts against its sandbox's
// cap: the lengths of its exit record, or what its segment files hold.
func (s *Manager) journalHeld(ss registry.Session) int64 {
	var n int64
	if ss.Exit != nil && len(ss.Exit.Lengths) > 0 {
		for _, l := range ss.Exit.Lengths {
			n += l
		}
		return n
	}
	segs, _ := filepath.Glob(filepath.Join(journalDir(s.Dir(ss)), "*", "*.seg"))
	for _, seg := range segs {
		if fi, err := os.Lstat(seg); err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
	}
	return n
}

// withBudget maps the budget file at path and calls fn with its counter.
func withBudget(path string, fn func(used *int64)) error {
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	mem, err := unix.Mmap(int(f.Fd()), 0, 8, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("map %s: %w", path, err)
	}
	defer unix.Munmap(mem)
	fn((*int64)(unsafe.Pointer(&mem[0])))
	return nil
}

// ensureBudget returns sb's budget file and the bytes it counts, making
// the file when missing from what sb's journals hold now. The caller holds
// sb's lock (every spawn and delete of its sessions does).
func (s *Manager) ensureBudget(sb registry.Sandbox) (string, int64, error) {
	path := s.budgetPath(sb)
	var used int64
	err := withBudget(path, func(u *int64) { used = atomic.LoadInt64(u) })
	if !errors.Is(err, os.ErrNotExist) {
		return path, used, err
	}
	sessions, err := s.reg.ListSessions(sb.Name)
	if err != nil {
		return "", 0, err
	}
	for _, ss := range sessions {
		if ss.Incarnation == sb.Incarnation {
			used += s.journalHeld(ss)
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", 0, err
	}
	if err := atomicfile.WriteFile(path, binary.NativeEndian.AppendUint64(nil, uint64(used)), 0o600); err != nil {
		return "", 0, err
	}
	return path, used, nil
}

// journalCap refuses a spawn in sb once its journals hold the cap, and
// otherwise gives spec the sandbox's budget. The caller holds sb's lock.
func (s *Manager) journalCap(sb registry.Sandbox, spec *sessiondir.Spec) error {
	max := s.cfg.SandboxJournalBytes
	if max <= 0 {
		return nil
	}
	path, used, err := s.ensureBudget(sb)
	if err != nil {
		return apierr.Unavailable("read the sandbox's journal budget: %v", err)
	}
	if used >= max {
		return apierr.Conflict("%s: the journals of sandbox %q hold %d bytes of at most %d (runnerd --sandbox-journal-bytes); what ended sessions held is collected first, so its running sessions hold it: terminate one (POST /v1/sandboxes/%s/sessions/{id}/terminate)", wire.DetailJournalCap, sb.Name, used, max, sb.Name)
	}
	if spec != nil {
		spec.JournalBudget, spec.JournalCap = path, max
	}
	return nil
}

// refundJournal subtracts ended session ss's journal from its sandbox's
// budget, before its directory goes. A sandbox without a budget file has
// nothing to subtract from.
func (s *Manager) refundJournal(ss registry.Session) {
	if s.cfg.SandboxJournalBytes <= 0 {
		return
	}
	sb := registry.Sandbox{Name: ss.Sandbox, Incarnation: ss.Incarnation}
	n := s.journalHeld(ss)
	err := withBudget(s.budgetPath(sb), func(u *int64) {
		for {
			cur := atomic.LoadInt64(u)
			if atomic.CompareAndSwapInt64(u, cur, max(cur-n, 0)) {
				return
			}
		}
	})
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		s.log.Warn("journal budget: subtract a deleted session", "sandbox", ss.Sandbox, "session", ss.ID, "err", err)
	}
}

// removeBudgets removes the budget files of sandbox name's incarnations
// (at destroy; a re-created sandbox starts from its own).
func (s *Manager) removeBudgets(name string) {
	files, _ := filepath.Glob(filepath.Join(s.cfg.StateDir, "budgets", name+".*"))
	for _, f := range files {
		if inc := strings.TrimPrefix(filepath.Base(f), name+"."); !strings.Contains(inc, ".") {
			os.Remove(f)
		}
	}
}
