package daemon

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/agentrunner/runner/daemon/apierr"
	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/daemon/sandboxes"
	"github.com/agentrunner/runner/daemon/sessions"
	"github.com/agentrunner/runner/wire"
)

// CapacityLimits bound what one host takes (Config.Capacity). A create
// beyond a bound is answered 503 unavailable with wire.Error.Exhausted
// set: nothing was created, and another host may take it. Re-creating a
// sandbox or session that exists (both creates are idempotent) is never
// refused.
type CapacityLimits struct {
	// MaxSandboxes is the most sandboxes the host holds; 0 is no bound.
	MaxSandboxes int
	// MaxSessions is the most sessions running (or starting) at once;
	// 0 is no bound.
	MaxSessions int
}

// admission counts the creates in flight, so that concurrent creates
// cannot together pass a bound that each alone would respect, and counts
// each exactly once: a create in flight is named (a sandbox by its name
// from the start, a session by its id once spawn has chosen it, before
// its record is committed), and the count is the union of what the
// registry holds and the in-flight names it does not hold yet. The
// registry is read and the in-flight set consulted under mu, and a name
// is set before its record is committed, so a create is counted either
// as a record or as in flight, never as both (which would under-admit)
// nor as neither (which would over-admit).
type admission struct {
	mu        sync.Mutex          // guards the sets
	sandboxes map[string]int      // sandbox creates in flight, by name (a count: concurrent creates of one name)
	sessions  map[*admitSlot]bool // session creates in flight
}

// admitSlot is one session create in flight; key is "" until spawn names it.
type admitSlot struct{ key string }

type admitSlotKey struct{}

// NameSession names the session create in flight of ctx (if admitted
// under a bound) before spawn commits its record.
func (a *admission) NameSession(ctx context.Context, sandbox, id string) {
	slot, _ := ctx.Value(admitSlotKey{}).(*admitSlot)
	if slot == nil {
		return
	}
	a.mu.Lock()
	slot.key = sandbox + "\x00" + id
	a.mu.Unlock()
}

// peekBody reads the request body (bounded as decodeJSON bounds it) and
// puts it back for the handler. A body it cannot read or decode passes
// through: the handler answers it.
func peekBody(r *http.Request, v any) bool {
	raw, err := io.ReadAll(io.LimitReader(r.Body, wire.MaxJSONBody+1))
	r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(raw), r.Body))
	return err == nil && json.Unmarshal(raw, v) == nil
}

// admitSandbox wraps POST /v1/sandboxes with Config.Capacity.MaxSandboxes.
func (s *server) admitSandbox(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		max := s.cfg.Capacity.MaxSandboxes
		var req wire.CreateSandbox
		if max <= 0 || !peekBody(r, &req) || sandboxes.ValidName(req.Name) != nil {
			h(w, r)
			return
		}
		a := &s.adm
		a.mu.Lock()
		sbs, _, err := s.reg.ListSandboxes("", -1) // one snapshot: every name
		if err != nil {
			a.mu.Unlock()
			s.writeError(w, r, apierr.Unavailable("count sandboxes: %v", err))
			return
		}
		held := make(map[string]bool, len(sbs)+len(a.sandboxes))
		for _, sb := range sbs {
			held[sb.Name] = true
		}
		for name := range a.sandboxes {
			held[name] = true
		}
		if !held[req.Name] && len(held) >= max {
			a.mu.Unlock()
			s.writeExhausted(w, r, fmt.Sprintf("host holds %d sandboxes (%d being created) of at most %d", len(sbs), len(held)-len(sbs), max))
			return
		}
		if a.sandboxes == nil {
			a.sandboxes = map[string]int{}
		}
		a.sandboxes[req.Name]++
		a.mu.Unlock()
		defer func() {
			a.mu.Lock()
			if a.sandboxes[req.Name]--; a.sandboxes[req.Name] == 0 {
				delete(a.sandboxes, req.Name)
			}
			a.mu.Unlock()
		}()
		h(w, r)
	}
}

// admitSession wraps POST .../sessions with Config.Capacity.MaxSessions.
func (s *server) admitSession(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		max := s.cfg.Capacity.MaxSessions
		var req wire.CreateSession
		if max <= 0 || !peekBody(r, &req) {
			h(w, r)
			return
		}
		if req.ID != "" {
			if _, err := s.reg.GetSession(r.PathValue("name"), req.ID); err == nil {
				h(w, r) // idempotent re-create
				return
			}
		}
		a := &s.adm
		a.mu.Lock()
		all, err := s.reg.AllSessions() // one snapshot
		if err != nil {
			a.mu.Unlock()
			s.writeError(w, r, apierr.Unavailable("count sessions: %v", err))
			return
		}
		n, recorded := 0, make(map[string]bool, len(all))
		for _, ss := range all {
			recorded[ss.Sandbox+"\x00"+ss.ID] = true
			if liveSession(ss) {
				n++
			}
		}
		inFlight := 0
		for slot := range a.sessions {
			if slot.key == "" || !recorded[slot.key] {
				if slot.key != "" {
					recorded[slot.key] = true // two creates of one id take one slot
				}
				inFlight++
			}
		}
		if n+inFlight >= max {
			a.mu.Unlock()
			s.writeExhausted(w, r, fmt.Sprintf("host runs %d sessions (%d being started) of at most %d", n, inFlight, max))
			return
		}
		slot := &admitSlot{}
		if a.sessions == nil {
			a.sessions = map[*admitSlot]bool{}
		}
		a.sessions[slot] = true
		a.mu.Unlock()
		defer func() {
			a.mu.Lock()
			delete(a.sessions, slot)
			a.mu.Unlock()
		}()
		h(w, r.WithContext(context.WithValue(r.Context(), admitSlotKey{}, slot)))
	}
}

// liveSessions counts the sessions the registry calls running or
// starting. A session whose command ended but whose record nobody has
// touched since still counts: the count errs on the full side.
func (s *server) liveSessions() (int, error) {
	all, err := s.reg.AllSessions()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, ss := range all {
		if liveSession(ss) {
			n++
		}
	}
	return n, nil
}

// liveSession reports whether ss takes a session slot: its record says
// running or starting and holds no exit.
func liveSession(ss registry.Session) bool {
	return ss.Exit == nil && (ss.State == wire.SessionRunning || ss.State == sessions.StateStarting)
}

// writeExhausted answers 503 unavailable with Exhausted set (see
// wire.Error.Exhausted). It is written here rather than through
// writeError because it is the one answer that carries the field.
func (s *server) writeExhausted(w http.ResponseWriter, r *http.Request, detail string) {
	s.metrics.countError(wire.CodeUnavailable)
	h := w.Header()
	h.Set(wire.HeaderError, string(wire.CodeUnavailable))
	h.Set("Content-Type", "application/json")
	body, _ := json.Marshal(wire.ErrorBody{Error: wire.Error{Code: wire.CodeUnavailable, Detail: "exhausted: " + detail, Exhausted: true}})
	body = append(body, '\n')
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(wire.CodeUnavailable.Status())
	w.Write(body)
}

func (s *server) handleCapacity(w http.ResponseWriter, r *http.Request) {
	c, err := s.capacity()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, c)
}

// capacity is GET /v1/capacity's answer (also part of GET /v1/info).
func (s *server) capacity() (wire.Capacity, error) {
	n, err := s.reg.CountSandboxes()
	if err != nil {
		return wire.Capacity{}, apierr.Unavailable("count sandboxes: %v", err)
	}
	live, err := s.liveSessions()
	if err != nil {
		return wire.Capacity{}, apierr.Unavailable("count sessions: %v", err)
	}
	c := wire.Capacity{
		Sandboxes:    n,
		MaxSandboxes: s.cfg.Capacity.MaxSandboxes,
		Sessions:     live,
		MaxSessions:  s.cfg.Capacity.MaxSessions,
		Cgroups:      s.sbx.Cgroups() != nil,
	}
	c.Exhausted = c.MaxSandboxes > 0 && n >= c.MaxSandboxes
	if c.MemoryAvailableBytes, err = memAvailable(); err != nil {
		return wire.Capacity{}, apierr.Unavailable("read memory: %v", err)
	}
	if c.PIDsFree, err = pidsFree(); err != nil {
		return wire.Capacity{}, apierr.Unavailable("read tasks: %v", err)
	}
	if err := s.underCgroupRoot(&c); err != nil {
		return wire.Capacity{}, err
	}
	return c, nil
}

// underCgroupRoot lowers c's host-wide memory and PIDs to what the
// sandboxes' cgroup root leaves under its limits (or an ancestor's),
// where one is set, and says which figure each is.
func (s *server) underCgroupRoot(c *wire.Capacity) error {
	c.MemorySource, c.PIDsSource = wire.CapacityHost, wire.CapacityHost
	if s.sbx.Cgroups() == nil {
		return nil
	}
	h, err := s.sbx.Cgroups().RootHeadroom()
	if err != nil {
		return apierr.Unavailable("read the sandboxes' cgroup root: %v", err)
	}
	if h.MemoryLimited {
		c.MemoryAvailableBytes, c.MemorySource = min(c.MemoryAvailableBytes, h.MemoryFree), wire.CapacityCgroup
	}
	if h.PidsLimited {
		c.PIDsFree, c.PIDsSource = min(c.PIDsFree, h.PidsFree), wire.CapacityCgroup
	}
	return nil
}

// memAvailable returns MemAvailable of /proc/meminfo in bytes.
func memAvailable() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "MemAvailable:")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("parse MemAvailable %q: %w", rest, err)
		}
		return kb * 1024, nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no MemAvailable in /proc/meminfo")
}

// pidsFree returns kernel.pid_max less the tasks that exist (the total of
// /proc/loadavg's "running/total" field).
func pidsFree() (int64, error) {
	raw, err := os.ReadFile("/proc/sys/kernel/pid_max")
	if err != nil {
		return 0, err
	}
	max, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse pid_max: %w", err)
	}
	raw, err = os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(raw))
	if len(f) < 4 {
		return 0, fmt.Errorf("parse /proc/loadavg %q", raw)
	}
	_, total, _ := strings.Cut(f[3], "/")
	tasks, err := strconv.ParseInt(total, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse /proc/loadavg %q: %w", raw, err)
	}
	return max - tasks, nil
}
