package cgroup

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// killPollInterval is how often a kill loop looks again for processes that
// are still dying or were forked before they were killed.
const killPollInterval = 5 * time.Millisecond

// killAll SIGKILLs every process procs lists until it lists none, bounded
// by ctx. A process forked while the loop runs is listed, and killed, on
// the next round; a forking process that was killed forks no more, so the
// loop converges (a fork bomb is also bounded by the sandbox's pids limit).
//
// It does not freeze the cgroup first (containerd's v1 Freeze waits for
// FROZEN with no bound and no context); instead each kill goes through a
// pidfd, and only after confirming that the process the pidfd names is
// inside the cgroup (member), so a pid that was reused by an unrelated
// process between reading cgroup.procs and the kill is never signalled.
func killAll(ctx context.Context, procs func() ([]int, error), member func(pid int) bool) error {
	for {
		pids, err := procs()
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		for _, pid := range pids {
			if err := killMember(pid, member); err != nil {
				return err
			}
		}
		t := time.NewTimer(killPollInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("wait for %d processes to die: %w", len(pids), ctx.Err())
		case <-t.C:
		}
	}
}

// killMember SIGKILLs pid if, once pinned by a pidfd, it is in the cgroup.
func killMember(pid int, member func(pid int) bool) error {
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil // gone already
	}
	if err != nil {
		return fmt.Errorf("open pidfd of %d: %w", pid, err)
	}
	defer unix.Close(fd)
	// The pidfd pins the process that has pid now. If that is not the one
	// cgroup.procs listed (it exited and the pid was reused), /proc/pid
	// describes the newcomer, which is outside the cgroup: skip it. If the
	// pinned process exits after this check, the signal goes nowhere.
	if !member(pid) {
		return nil
	}
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("kill %d: %w", pid, err)
	}
	return nil
}

// procCgroup returns the cgroup path of pid in the hierarchy whose
// /proc/pid/cgroup controller list contains controller ("" for v2's unified
// line), and false when pid is gone or not in such a hierarchy.
func procCgroup(pid int, controller string) (string, bool) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return "", false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if controller == "" {
			if parts[0] == "0" && parts[1] == "" {
				return parts[2], true
			}
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == controller {
				return parts[2], true
			}
		}
	}
	return "", false
}

// under reports whether cgroup path p is dir or inside it.
func under(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

// rmdirTree removes the cgroup directory dir and the cgroups below it,
// deepest first (a cgroup directory goes with rmdir once it has no child
// and no process; its files go with it). Absent is success.
func rmdirTree(dir string) error {
	children, err := listDirs(dir)
	if err != nil {
		return err
	}
	for _, c := range children {
		if err := rmdirTree(dir + "/" + c); err != nil {
			return err
		}
	}
	if err := unix.Rmdir(dir); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("rmdir %s: %w", dir, err)
	}
	return nil
}
