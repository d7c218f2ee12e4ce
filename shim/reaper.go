package shim

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The shim is a child subreaper (PR_SET_CHILD_SUBREAPER), set before the
// command starts: a descendant whose parent dies (a double fork, a
// backgrounded job of a shell that exited) is reparented to the shim, not
// to init, so every process a session started stays below its shim, where
// terminate can find and kill it. The shim reaps all of them: it owns every
// wait of the process, through one wait4(-1) loop (the reaper below),
// instead of exec.Cmd.Wait, so the command's status is never taken by
// anyone else and an orphan never stays a zombie.
//
// The set of processes below the shim is found by scanning /proc for
// parent pids (/proc/PID/task/TID/children needs CONFIG_PROC_CHILDREN,
// which not every kernel has). Processes cannot leave that set except by
// dying: a process's parent changes only when its parent dies, and it is
// then reparented to the nearest subreaper above it, the shim at the
// latest.

// setSubreaper makes the calling process a child subreaper.
func setSubreaper() error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("become child subreaper: %w", err)
	}
	return nil
}

// reaper reaps every child of the shim with wait4(-1). It records the
// command's (main's) wait status and closes mainDone when the command is
// reaped; it closes allDone, and returns, once the shim has no child left,
// which with the subreaper means no descendant left.
type reaper struct {
	main     int
	mainDone chan struct{} // closed once main is reaped; status and err are set before
	allDone  chan struct{} // closed once wait4 reports no child left
	reaped   chan struct{} // receives a token after each reap (capacity 1, never blocks)

	status syscall.WaitStatus // main's, valid after mainDone
	err    error              // set instead of status if main could not be waited for
}

func newReaper(main int) *reaper {
	return &reaper{main: main, mainDone: make(chan struct{}), allDone: make(chan struct{}), reaped: make(chan struct{}, 1)}
}

// loop runs until no child is left. It must be the only waiter of the
// process once it runs.
func (r *reaper) loop() {
	defer close(r.allDone)
	mainReaped := false
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			// ECHILD: nothing is left below the shim. Any other error
			// cannot happen with these arguments; it ends the wait too.
			if !mainReaped {
				r.err = fmt.Errorf("wait4: %w", err)
				close(r.mainDone)
			}
			return
		}
		if pid == r.main && !mainReaped {
			mainReaped = true
			r.status = ws
			close(r.mainDone)
		}
		select {
		case r.reaped <- struct{}{}:
		default:
		}
	}
}

// tree is what the session started that still lives: the processes
// below the shim (me), and in a pod those of the session's cgroup leaf
// too. A pod's orphans are reparented to the pod's init, its holder, not
// to the shim (a subreaper's reach ends at a pid namespace it is not
// in), so a backgrounded job whose shell exited is found by its leaf,
// which it cannot leave (the sandbox's filter and user namespace keep it
// from writing a cgroup's procs outside its own namespace's root).
func (s *server) tree(me int) ([]proc, error) {
	ps, err := descendants(me)
	if err != nil {
		return ps, err
	}
	return s.withLeaf(ps), nil
}

// lingerInLeaf keeps a pod session's shim (its status, its terminate)
// while the session's leaf holds a process the pod's init adopted: the
// shim lingers for them as it does for its own descendants.
func (s *server) lingerInLeaf() {
	for len(s.withLeaf(nil)) > 0 {
		time.Sleep(leafLingerPoll)
	}
}

// leafLingerPoll is how often a lingering pod session's leaf is read.
const leafLingerPoll = 250 * time.Millisecond

// withLeaf adds to ps the live processes of a pod session's cgroup leaf
// (none outside a pod or without cgroups).
func (s *server) withLeaf(ps []proc) []proc {
	if s.spec.Pod == nil || len(s.spec.Cgroups) == 0 {
		return ps
	}
	seen := map[int]bool{}
	for _, p := range ps {
		seen[p.pid] = true
	}
	for _, dir := range s.spec.Cgroups {
		b, err := os.ReadFile(dir + "/cgroup.procs")
		if err != nil {
			continue // a hierarchy gone: the others still list it
		}
		for _, f := range bytes.Fields(b) {
			pid, err := strconv.Atoi(string(f))
			if err != nil || pid <= 1 || seen[pid] {
				continue
			}
			if _, p, state, ok := readStat(pid); ok && state != 'Z' {
				seen[pid] = true
				ps = append(ps, p)
			}
		}
	}
	return ps
}

// proc is one process found below the shim.
type proc struct {
	pid, pgid int
	start     uint64 // start time in clock ticks since boot (stat field 22)
}

// descendants returns the live processes below root (not root itself;
// zombies are dead and not returned), by scanning /proc. A process that
// starts or ends during the scan may be missed or reported: callers that
// must see none left repeat the scan.
func descendants(root int) ([]proc, error) {
	d, err := os.Open("/proc")
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	type node struct {
		proc
		zombie bool
	}
	children := map[int][]node{}
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil || pid <= 0 {
			continue
		}
		ppid, p, state, ok := readStat(pid)
		if !ok {
			continue // gone meanwhile
		}
		children[ppid] = append(children[ppid], node{p, state == 'Z' || state == 'X'})
	}
	var out []proc
	queue := []int{root}
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		for _, n := range children[pid] {
			if !n.zombie {
				out = append(out, n.proc)
			}
			queue = append(queue, n.pid)
		}
	}
	return out, nil
}

// readStat reads a process's parent, group, start time and state from
// /proc/PID/stat. The command name (field 2) may contain anything, so the
// fields are taken after its last ')'.
func readStat(pid int) (ppid int, p proc, state byte, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, proc{}, 0, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, proc{}, 0, false
	}
	// After ')': state(3) ppid(4) pgrp(5) session(6) ... starttime(22).
	f := bytes.Fields(b[i+1:])
	if len(f) < 20 || len(f[0]) != 1 {
		return 0, proc{}, 0, false
	}
	ppid, err1 := strconv.Atoi(string(f[1]))
	pgid, err2 := strconv.Atoi(string(f[2]))
	start, err3 := strconv.ParseUint(string(f[19]), 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return 0, proc{}, 0, false
	}
	return ppid, proc{pid: pid, pgid: pgid, start: start}, f[0][0], true
}

// signalProc sends sig to p itself, through a pidfd taken after checking
// that the pid still names the process that was found (same start time),
// so a recycled pid is never signalled.
func signalProc(p proc, sig syscall.Signal) {
	fd, err := unix.PidfdOpen(p.pid, 0)
	if err != nil {
		return // gone
	}
	defer unix.Close(fd)
	if _, now, _, ok := readStat(p.pid); !ok || now.start != p.start {
		return
	}
	unix.PidfdSendSignal(fd, sig, nil, 0)
}

// signalGroupOf sends sig to p's process group, or to p alone when its
// group is the shim's own (a descendant can only be in the shim's group
// when the shim was not started detached, as in some tests: never signal
// ourselves).
func signalGroupOf(p proc, sig syscall.Signal) {
	if p.pgid <= 1 || p.pgid == syscall.Getpgrp() {
		signalProc(p, sig)
		return
	}
	syscall.Kill(-p.pgid, sig)
}

// Kill polling: how often the tree is rescanned while it is being
// stopped, and how long killTree keeps sending SIGKILL before it gives up
// (only a process stuck in the kernel outlives SIGKILL that long).
const (
	killPoll = 10 * time.Millisecond
	killWait = 5 * time.Second
)

// killTree stops every process below the shim: SIGTERM (followed by
// SIGCONT, so a stopped process sees it) to the process group of each
// descendant, repeated for descendants that appear later; after grace,
// SIGKILL to every descendant still alive, repeated until none is left. It
// returns the number still alive when it gave up (0: none left).
// signalled names a process group the caller has just sent SIGTERM (0 for
// none), which is not sent a second one.
func (s *server) killTree(grace time.Duration, signalled int) int {
	me := os.Getpid()
	termed := map[int]bool{signalled: true} // process groups already sent SIGTERM
	deadline := time.Now().Add(grace)
	giveUp := deadline.Add(killWait)
	tick := time.NewTicker(killPoll)
	defer tick.Stop()
	for {
		select {
		case <-s.reap.allDone:
			if s.spec.Pod == nil {
				return 0 // nothing below the shim
			}
		default:
		}
		ps, err := s.tree(me)
		if err == nil && len(ps) == 0 {
			return 0
		}
		now := time.Now()
		if now.After(giveUp) {
			return len(ps)
		}
		for _, p := range ps {
			if now.Before(deadline) {
				if !termed[p.pgid] {
					termed[p.pgid] = true
					signalGroupOf(p, syscall.SIGTERM)
					signalGroupOf(p, syscall.SIGCONT)
				}
			} else {
				signalProc(p, syscall.SIGKILL)
			}
		}
		select {
		case <-s.reap.reaped:
		case <-tick.C:
		}
	}
}

// signalTree sends sig to the process group of every process of the
// session (tree), once each, except group skip (0: none).
func (s *server) signalTree(sig syscall.Signal, skip int) {
	ps, _ := s.tree(os.Getpid())
	seen := map[int]bool{skip: true}
	for _, p := range ps {
		if !seen[p.pgid] {
			seen[p.pgid] = true
			signalGroupOf(p, sig)
		}
	}
}

// countDescendants returns the number of live processes below the shim
// other than the command itself (-1 if /proc cannot be read).
func (s *server) countDescendants() int {
	ps, err := s.tree(os.Getpid())
	if err != nil {
		return -1
	}
	n := 0
	for _, p := range ps {
		if p.pid != s.pid {
			n++
		}
	}
	return n
}
