// Command attack is the hostile command of the daemon's isolation tests
// (hostile_test.go): run inside a sandbox, each subcommand tries one
// escape and prints one machine-readable line, "ok" when the escape
// worked, else the step that failed and its errno name (e.g.
// "open:EACCES"). It always exits 0 on a result, 2 on bad usage.
//
//	attack read PATH          open PATH for reading, read a byte
//	attack write PATH         create PATH and write to it
//	attack ls PATH            list the directory PATH
//	attack setns PATH         open the namespace file PATH, setns(CLONE_NEWNET)
//	attack nft [TABLE]        list nftables tables (prints whether "inet TABLE" is visible),
//	                          then try to delete table inet TABLE (default runner) and add one
//	attack route              add a route (203.0.113.0/24 on lo)
//	attack link               set lo down
//	attack unix PATH          connect to the unix socket PATH
//	attack dial ADDR          TCP connect to ADDR (host:port), 2 s timeout
//	attack hold ADDR          keep one HTTP/1.1 connection to ADDR and send a request on it
//	                          every 50 ms, printing "ok UNIXNANO" per answer, until one fails:
//	                          then "cut STEP:ERRNO" (the only subcommand printing several lines)
//	attack kill PID           kill -9 PID
//	attack ptrace PID         PTRACE_ATTACH to PID
//	attack mount DIR          mount a tmpfs on DIR
//	attack status             this process's uid, gid, capability sets and no_new_privs
package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	arg := func(i int) string {
		if len(os.Args) <= i+1 {
			usage()
		}
		return os.Args[i+1]
	}
	var out string
	switch os.Args[1] {
	case "read":
		out = readFile(arg(1))
	case "write":
		out = step("open", os.WriteFile(arg(1), []byte("pwned\n"), 0o644))
	case "ls":
		_, err := os.ReadDir(arg(1))
		out = step("readdir", err)
	case "setns":
		out = setns(arg(1))
	case "nft":
		table := "runner"
		if len(os.Args) > 2 {
			table = os.Args[2]
		}
		out = nft(table)
	case "route":
		out = route()
	case "link":
		out = link()
	case "unix":
		c, err := net.DialTimeout("unix", arg(1), 2*time.Second)
		if err == nil {
			c.Close()
		}
		out = step("connect", err)
	case "dial":
		c, err := net.DialTimeout("tcp", arg(1), 2*time.Second)
		if err == nil {
			c.Close()
		}
		out = step("connect", err)
	case "hold":
		hold(arg(1))
		return
	case "kill":
		out = step("kill", syscall.Kill(pid(arg(1)), syscall.SIGKILL))
	case "ptrace":
		out = ptrace(pid(arg(1)))
	case "mount":
		out = step("mount", unix.Mount("none", arg(1), "tmpfs", 0, ""))
	case "status":
		out = status()
	default:
		usage()
	}
	fmt.Println(out)
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: attack read|write|ls|setns|unix|mount PATH | nft | route | link | dial ADDR | kill|ptrace PID | status")
	os.Exit(2)
}

func pid(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		usage()
	}
	return n
}

// step is "ok" for a nil err, else "STEP:ERRNO".
func step(name string, err error) string {
	if err == nil {
		return "ok"
	}
	return name + ":" + errnoName(err)
}

func errnoName(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		if n := unix.ErrnoName(errno); n != "" {
			return n
		}
		return strconv.Itoa(int(errno))
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "ETIMEDOUT"
	}
	return strings.ReplaceAll(err.Error(), " ", "_")
}

func readFile(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return step("open", err)
	}
	defer f.Close()
	var b [1]byte
	if _, err := f.Read(b[:]); err != nil && err.Error() != "EOF" {
		return step("read", err)
	}
	return "ok"
}

func setns(path string) string {
	runtime.LockOSThread() // the thread that enters stays locked: never reused
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return step("open", err)
	}
	return step("setns", unix.Setns(fd, unix.CLONE_NEWNET))
}

// nft reports whether the table inet TABLE (runnerd's rules, in the
// host's namespace; GET /v1/info's network_table) is visible from here,
// then tries to delete it and to add a table of its own.
func nft(table string) string {
	c, err := nftables.New()
	if err != nil {
		return step("netlink", err)
	}
	visible := false
	tables, err := c.ListTables()
	for _, t := range tables {
		if t.Name == table {
			visible = true
		}
	}
	list := "list:ok"
	if err != nil {
		list = step("list", err)
	}
	c.DelTable(&nftables.Table{Name: table, Family: nftables.TableFamilyINet})
	del := step("del", c.Flush())
	c.AddTable(&nftables.Table{Name: "attack", Family: nftables.TableFamilyINet})
	add := step("add", c.Flush())
	return fmt.Sprintf("runner-visible=%t %s %s %s", visible, list, del, add)
}

func route() string {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return step("link", err)
	}
	_, dst, _ := net.ParseCIDR("203.0.113.0/24")
	return step("route", netlink.RouteAdd(&netlink.Route{LinkIndex: lo.Attrs().Index, Dst: dst}))
}

func link() string {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return step("link", err)
	}
	return step("linkset", netlink.LinkSetDown(lo))
}

func hold(addr string) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		fmt.Println("cut", step("connect", err))
		return
	}
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		c.SetDeadline(time.Now().Add(time.Second))
		_, err := fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: hold\r\n\r\n")
		if err == nil {
			var resp *http.Response
			if resp, err = http.ReadResponse(br, nil); err == nil {
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
		if err != nil {
			fmt.Println("cut", step("request", err))
			return
		}
		fmt.Println("ok", time.Now().UnixNano())
		time.Sleep(50 * time.Millisecond)
	}
}

func ptrace(pid int) string {
	runtime.LockOSThread() // ptrace requests must come from the tracer thread
	defer runtime.UnlockOSThread()
	if err := unix.PtraceAttach(pid); err != nil {
		return step("ptrace", err)
	}
	unix.PtraceDetach(pid)
	return "ok"
}

// status prints uid, gid and the capability and no_new_privs lines of
// /proc/self/status, e.g. "uid=1879048192 gid=1879048192 CapEff=0000000000000000 ...".
func status() string {
	raw, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return step("status", err)
	}
	parts := []string{fmt.Sprintf("uid=%d euid=%d gid=%d", os.Getuid(), os.Geteuid(), os.Getgid())}
	for _, line := range strings.Split(string(raw), "\n") {
		k, v, ok := strings.Cut(line, ":")
		switch k {
		case "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Groups":
			if ok {
				parts = append(parts, k+"="+strings.Join(strings.Fields(v), ","))
			}
		}
	}
	return strings.Join(parts, " ")
}
