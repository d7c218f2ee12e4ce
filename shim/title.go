package shim

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// A shim's process title names its session, so `ps` shows which sandbox
// and session each supervisor holds instead of "runnerd shim --warm-fd=3
// ...". A warm shim is started before it knows its session, so the title
// is written when it learns it, in place: the kernel reads
// /proc/PID/cmdline from the process's own argv memory (arg_start to
// arg_end, in /proc/self/stat), and when the NUL that ends the arguments
// has been overwritten it reads on into the environment area that follows
// and stops at the first NUL (setproctitle(3)'s convention, which
// get_mm_cmdline keeps). So the room for a title is the arguments and
// the environment together, with no argument reserved for it. Only a
// title longer than the original arguments (rare: those hold the session
// directory's path) spills into the environment area, and then only as far
// as it needs, leaving /proc/PID/environ's first entries overwritten;
// nothing in the shim reads them, since Go copied the environment at start
// and a command's environment is its spec's.
//
// The memory is written through /proc/self/mem, so no Go pointer is made
// from an address. Go's os.Args point into that memory (the runtime does
// not copy them), so init below copies them first: nothing in this
// process reads the old arguments after a title is set.
//
// comm (/proc/PID/comm, what top and pgrep match) becomes "shim SANDBOX"
// cut to 15 bytes, so `pkill runnerd` no longer matches a session's shim.

func init() {
	for i, a := range os.Args {
		os.Args[i] = strings.Clone(a)
	}
}

// titleFor is the process title of sandbox's session id's shim. The
// sandbox is left out when the spec names none (a runner-shim started
// by hand or by a provider's adapter).
func titleFor(sandbox, id string) string {
	if sandbox == "" {
		return "runner-shim session=" + id
	}
	return "runner-shim sandbox=" + sandbox + " session=" + id
}

// commFor is comm for sandbox's shims: "shim " and the sandbox, at most
// 15 bytes (the kernel's TASK_COMM_LEN less its NUL).
func commFor(sandbox, id string) string {
	name := sandbox
	if name == "" {
		name = id
	}
	c := "shim " + name
	if len(c) > 15 {
		c = c[:15]
	}
	return c
}

// setTitle sets this process's title (cmdline, cut to the room there is)
// and its comm. It reports the first failure; a shim without a title
// works the same, so callers log and go on.
func setTitle(title, comm string) error {
	terr := writeCmdline(title)
	cerr := os.WriteFile("/proc/self/comm", []byte(comm), 0)
	if terr != nil {
		return terr
	}
	if cerr != nil {
		return fmt.Errorf("set comm: %w", cerr)
	}
	return nil
}

// writeCmdline writes title over the argument and environment areas.
func writeCmdline(title string) error {
	argStart, argEnd, envStart, envEnd, err := cmdlineArea()
	if err != nil {
		return err
	}
	room := argEnd - argStart // bytes the title and its NUL may use
	if envStart == argEnd && envEnd > envStart {
		room = envEnd - argStart
	}
	const page = 4096 // get_mm_proctitle reads at most a page
	room = min(room, page)
	if room < 2 {
		return errors.New("set title: no room in argv")
	}
	t := []byte(title)
	if len(t) > int(room)-1 {
		t = t[:room-1]
	}
	// The arguments area is zeroed behind the title, except its last
	// byte: a non-NUL there is what makes the kernel read the title up
	// to its NUL instead of the whole arguments area.
	buf := make([]byte, max(int(argEnd-argStart), len(t)+1))
	copy(buf, t)
	if len(t)+1 < int(argEnd-argStart) {
		buf[argEnd-argStart-1] = ' '
	}
	mem, err := os.OpenFile("/proc/self/mem", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("set title: %w", err)
	}
	defer mem.Close()
	if _, err := mem.WriteAt(buf, int64(argStart)); err != nil {
		return fmt.Errorf("set title: %w", err)
	}
	return nil
}

// cmdlineArea reads arg_start, arg_end, env_start and env_end, fields 48
// to 51 of /proc/self/stat (proc(5)).
func cmdlineArea() (argStart, argEnd, envStart, envEnd uint64, err error) {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return 0, 0, 0, 0, fmt.Errorf("set title: %w", err)
	}
	// Field 2, comm, is in parentheses and may hold spaces: count from
	// the last ')', which is field 2's end.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, 0, 0, errors.New("set title: malformed /proc/self/stat")
	}
	f := strings.Fields(string(b[i+1:])) // field 3 onward
	const first = 48 - 3
	if len(f) < first+4 {
		return 0, 0, 0, 0, errors.New("set title: /proc/self/stat has no arg_start (kernel before 3.5)")
	}
	var v [4]uint64
	for k := range v {
		if v[k], err = strconv.ParseUint(f[first+k], 10, 64); err != nil {
			return 0, 0, 0, 0, fmt.Errorf("set title: /proc/self/stat field %d: %w", 48+k, err)
		}
	}
	if v[1] <= v[0] {
		return 0, 0, 0, 0, errors.New("set title: empty arguments area")
	}
	return v[0], v[1], v[2], v[3], nil
}
