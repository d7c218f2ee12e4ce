// Command probe is the seccomp package's test program: it optionally
// becomes another user, sets no_new_privs and loads the filter, in the
// order the shim's helper does, and then tries the gated calls, runs an
// ordinary workload, or executes a program. It is built per test run.
//
//	probe [-setup-net] [-uid N] [-filter] attacks      one "name errno" line per gated call
//	probe [-setup-net] [-uid N] [-filter] workload     "ok name" lines; exit 1 on a failure
//	probe [-setup-net] [-uid N] [-filter] ptrace PID   "ptrace errno"; refused as root
//	probe [-setup-net] [-uid N] [-filter] exec ARGV... execve(ARGV) under the filter
//	probe [-uid N] [-filter] btrfs-ioctls DIR          one "name errno" line per btrfs subvolume/snapshot ioctl
//	probe [-uid N] [-filter] btrfs-escape DIR BYTES    a nested subvolume in DIR, BYTES written into it
//	probe load-without-nnp                             what Load says without no_new_privs
package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/agentrunner/runner/seccomp"
	"golang.org/x/sys/unix"
)

func init() {
	// no_new_privs is per thread: set it, load the filter and execve on
	// one thread, as the helper does.
	runtime.LockOSThread()
}

func main() {
	filter := flag.Bool("filter", false, "load the filter")
	uid := flag.Int("uid", -1, "become this uid (and gid) first")
	setupNet := flag.Bool("setup-net", false, "bring lo up and open ping sockets to every group (run in a fresh netns)")
	flag.Parse()
	args := flag.Args()
	if len(args) == 0 {
		die("no mode")
	}
	if args[0] == "load-without-nnp" {
		f, err := seccomp.Default()
		if err != nil {
			die("compile: %v", err)
		}
		err = f.Load()
		fmt.Printf("is ErrNoNewPrivs: %v\n", errors.Is(err, seccomp.ErrNoNewPrivs))
		return
	}
	if *setupNet {
		if out, err := exec.Command("ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
			die("ip link set lo up: %v: %s", err, out)
		}
		if err := os.WriteFile("/proc/sys/net/ipv4/ping_group_range", []byte("0 2147483647"), 0); err != nil {
			die("ping_group_range: %v", err)
		}
	}
	if *uid >= 0 {
		if err := syscall.Setgroups(nil); err != nil {
			die("setgroups: %v", err)
		}
		if err := syscall.Setgid(*uid); err != nil {
			die("setgid: %v", err)
		}
		if err := syscall.Setuid(*uid); err != nil {
			die("setuid: %v", err)
		}
	}
	if *filter {
		f, err := seccomp.Default()
		if err != nil {
			die("compile: %v", err)
		}
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			die("no_new_privs: %v", err)
		}
		if err := f.Load(); err != nil {
			die("load: %v", err)
		}
	}
	switch args[0] {
	case "attacks":
		attacks()
	case "workload":
		workload()
	case "ptrace":
		if os.Getuid() == 0 {
			die("ptrace probe refused as root: it would stop its target")
		}
		pid, err := strconv.Atoi(args[1])
		if err != nil {
			die("pid: %v", err)
		}
		_, _, e := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_ATTACH, uintptr(pid), 0, 0, 0, 0)
		fmt.Printf("ptrace %d\n", int(e))
	case "btrfs-ioctls":
		btrfsIoctls(args[1])
	case "btrfs-escape":
		btrfsEscape(args[1], args[2])
	case "exec":
		path, err := exec.LookPath(args[1])
		if err != nil {
			die("%v", err)
		}
		die("exec: %v", syscall.Exec(path, args[1:], os.Environ()))
	default:
		die("unknown mode %q", args[0])
	}
}

func die(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "probe: "+format+"\n", a...)
	os.Exit(2)
}

const (
	absent  = "/nonexistent-runner-probe"
	afVsock = 40
	afAlg   = 38
)

// attacks tries each gated call with arguments that are harmless when the
// kernel does get them (bad magic, missing paths, invalid sizes): the
// unfiltered run shows the kernel's own answer, the filtered one the
// filter's.
func attacks() {
	str := func(s string) uintptr { p, _ := unix.BytePtrFromString(s); return uintptr(unsafe.Pointer(p)) }
	raw := func(nr uintptr, a ...uintptr) unix.Errno {
		var v [6]uintptr
		copy(v[:], a)
		r, _, e := unix.Syscall6(nr, v[0], v[1], v[2], v[3], v[4], v[5])
		if e == 0 && nr != unix.SYS_PERSONALITY && nr != unix.SYS_KEYCTL && nr != unix.SYS_ADD_KEY && nr != unix.SYS_SYSLOG {
			unix.Close(int(r)) // a descriptor some of them return
		}
		return e
	}
	var ts unix.Timespec
	var ioParams [120]byte
	var bpfAttr [128]byte
	perf := unix.PerfEventAttr{Type: unix.PERF_TYPE_SOFTWARE, Config: unix.PERF_COUNT_SW_TASK_CLOCK,
		Size: uint32(unsafe.Sizeof(unix.PerfEventAttr{})), Bits: unix.PerfBitExcludeKernel | unix.PerfBitExcludeHv}
	probes := []struct {
		name string
		try  func() unix.Errno
	}{
		{"unshare_user", func() unix.Errno { return raw(unix.SYS_UNSHARE, unix.CLONE_NEWUSER) }},
		{"clone_newuser", func() unix.Errno {
			pid, err := syscall.ForkExec("/bin/true", []string{"true"}, &syscall.ProcAttr{
				Sys: &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWUSER}})
			if err != nil {
				var en unix.Errno
				errors.As(err, &en)
				return en
			}
			var ws syscall.WaitStatus
			syscall.Wait4(pid, &ws, 0, nil)
			return 0
		}},
		{"clone3", func() unix.Errno { return raw(unix.SYS_CLONE3, 0, 0) }},
		{"setns", func() unix.Errno { return raw(unix.SYS_SETNS, ^uintptr(0), 0) }},
		{"keyctl", func() unix.Errno {
			return raw(unix.SYS_KEYCTL, unix.KEYCTL_GET_KEYRING_ID, uintptr(unix.KEY_SPEC_SESSION_KEYRING&0xffffffff), 1)
		}},
		{"add_key", func() unix.Errno {
			return raw(unix.SYS_ADD_KEY, str("user"), str("runner-probe"), str("x"), 1, uintptr(unix.KEY_SPEC_PROCESS_KEYRING&0xffffffff))
		}},
		{"request_key", func() unix.Errno { return raw(unix.SYS_REQUEST_KEY, str("user"), str("runner-probe-absent"), 0, 0) }},
		{"bpf", func() unix.Errno {
			return raw(unix.SYS_BPF, unix.BPF_MAP_CREATE, uintptr(unsafe.Pointer(&bpfAttr)), 64)
		}},
		{"perf_event_open", func() unix.Errno {
			return raw(unix.SYS_PERF_EVENT_OPEN, uintptr(unsafe.Pointer(&perf)), 0, ^uintptr(0), ^uintptr(0), 0)
		}},
		{"init_module", func() unix.Errno { return raw(unix.SYS_INIT_MODULE, 0, 0, str("")) }},
		{"finit_module", func() unix.Errno { return raw(unix.SYS_FINIT_MODULE, ^uintptr(0), str(""), 0) }},
		{"delete_module", func() unix.Errno { return raw(unix.SYS_DELETE_MODULE, str("runner_probe_absent"), unix.O_NONBLOCK) }},
		{"kexec_load", func() unix.Errno { return raw(unix.SYS_KEXEC_LOAD, 0, 0, 0, 0x100) }},
		{"reboot", func() unix.Errno { return raw(unix.SYS_REBOOT, 0, 0, 0, 0) }}, // bad magic
		{"swapon", func() unix.Errno { return raw(unix.SYS_SWAPON, str(absent), 0) }},
		{"mount", func() unix.Errno { return raw(unix.SYS_MOUNT, str("none"), str(absent), str("tmpfs"), 0, str("")) }},
		{"umount2", func() unix.Errno { return raw(unix.SYS_UMOUNT2, str(absent), 0) }},
		{"pivot_root", func() unix.Errno { return raw(unix.SYS_PIVOT_ROOT, str(absent), str(absent+"-old")) }},
		{"clock_settime", func() unix.Errno {
			return raw(unix.SYS_CLOCK_SETTIME, unix.CLOCK_MONOTONIC, uintptr(unsafe.Pointer(&ts)))
		}},
		{"settimeofday", func() unix.Errno { return raw(unix.SYS_SETTIMEOFDAY, 0, 0) }},    // sets nothing
		{"personality", func() unix.Errno { return raw(unix.SYS_PERSONALITY, 0x0040000) }}, // ADDR_NO_RANDOMIZE
		{"io_uring_setup", func() unix.Errno { return raw(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(&ioParams))) }},
		{"userfaultfd", func() unix.Errno { return raw(unix.SYS_USERFAULTFD, unix.O_CLOEXEC) }},
		{"open_by_handle_at", func() unix.Errno { return raw(unix.SYS_OPEN_BY_HANDLE_AT, ^uintptr(0), 0, 0) }},
		{"socket_vsock", func() unix.Errno { return raw(unix.SYS_SOCKET, afVsock, unix.SOCK_STREAM, 0) }},
		{"socket_alg", func() unix.Errno { return raw(unix.SYS_SOCKET, afAlg, unix.SOCK_SEQPACKET, 0) }},
		{"syslog", func() unix.Errno { return raw(unix.SYS_SYSLOG, 10, 0, 0) }}, // SYSLOG_ACTION_SIZE_BUFFER
	}
	for _, p := range probes {
		fmt.Printf("%s %d\n", p.name, int(p.try()))
	}
}

// workload is what an ordinary Go program does: threads, fork and exec,
// files, sockets of several families, a ping socket, a timer.
func workload() {
	check := func(name string, err error) {
		if err != nil {
			fmt.Printf("FAIL %s: %v\n", name, err)
			os.Exit(1)
		}
		fmt.Printf("ok %s\n", name)
	}
	check("threads", func() error {
		// Goroutines locked to their threads force the runtime to clone
		// new ones.
		var wg sync.WaitGroup
		tids := make(chan int, 8)
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				runtime.LockOSThread()
				tids <- unix.Gettid()
				time.Sleep(10 * time.Millisecond)
			}()
		}
		wg.Wait()
		close(tids)
		seen := map[int]bool{}
		for t := range tids {
			seen[t] = true
		}
		if len(seen) != 8 {
			return fmt.Errorf("%d distinct threads, want 8", len(seen))
		}
		return nil
	}())
	check("fork_exec", func() error {
		out, err := exec.Command("/bin/sh", "-c", "echo forked $((6*7))").Output()
		if err == nil && string(out) != "forked 42\n" {
			err = fmt.Errorf("got %q", out)
		}
		return err
	}())
	check("files", func() error {
		dir, err := os.MkdirTemp("", "probe")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		p := dir + "/f"
		if err := os.WriteFile(p+".tmp", []byte("hello"), 0o600); err != nil {
			return err
		}
		if err := os.Rename(p+".tmp", p); err != nil {
			return err
		}
		if err := os.Symlink(p, dir+"/l"); err != nil {
			return err
		}
		if err := os.Chmod(p, 0o644); err != nil {
			return err
		}
		b, err := os.ReadFile(dir + "/l")
		if err == nil && string(b) != "hello" {
			err = fmt.Errorf("read %q", b)
		}
		return err
	}())
	check("tcp_loopback", func() error {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		defer ln.Close()
		go func() {
			c, err := ln.Accept()
			if err == nil {
				c.Write([]byte("pong"))
				c.Close()
			}
		}()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			return err
		}
		defer c.Close()
		b := make([]byte, 4)
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(b); err != nil {
			return err
		}
		if string(b) != "pong" {
			return fmt.Errorf("got %q", b)
		}
		return nil
	}())
	check("unix_socketpair", func() error {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fds[0])
		defer unix.Close(fds[1])
		if _, err := unix.Write(fds[0], []byte("x")); err != nil {
			return err
		}
		b := make([]byte, 1)
		_, err = unix.Read(fds[1], b)
		return err
	}())
	check("netlink_route", func() error {
		_, err := net.Interfaces() // an AF_NETLINK socket
		return err
	}())
	check("ping_socket", ping())
}

// ping sends one ICMP echo to 127.0.0.1 through an unprivileged ping
// socket (SOCK_DGRAM, IPPROTO_ICMP) and waits for the reply.
func ping() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMP)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	echo := []byte{8, 0, 0, 0, 0, 0, 0, 1, 'r', 'u', 'n'} // type 8, id and checksum filled by the kernel
	to := &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}
	if err := unix.Sendto(fd, echo, 0, to); err != nil {
		return fmt.Errorf("sendto: %w", err)
	}
	tv := unix.Timeval{Sec: 5}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return err
	}
	b := make([]byte, 64)
	n, _, err := unix.Recvfrom(fd, b, 0)
	if err != nil {
		return fmt.Errorf("recvfrom: %w", err)
	}
	if n < 8 || b[0] != 0 || !strings.HasSuffix(string(b[:n]), "run") {
		return fmt.Errorf("reply %x is not an echo reply", b[:n])
	}
	return nil
}
