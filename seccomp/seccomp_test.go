package seccomp

import (
	"encoding/binary"
	"errors"
	"runtime"
	"testing"
	"unsafe"

	"github.com/moby/profiles/seccomp"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

var (
	retAllow  = uint32(unix.SECCOMP_RET_ALLOW)
	retEPERM  = uint32(unix.SECCOMP_RET_ERRNO) | uint32(unix.EPERM)
	retENOSYS = uint32(unix.SECCOMP_RET_ERRNO) | uint32(unix.ENOSYS)
)

func mustDefault(t *testing.T) *Filter {
	t.Helper()
	f, err := Default()
	if err != nil {
		t.Fatalf("Default: %v", err)
	}
	return f
}

// eval runs f in golang.org/x/net/bpf's VM over the seccomp_data of one
// call. The VM loads words big endian where the kernel loads them in
// native order, so each word is stored big endian at the offset the
// program reads it from (the low word of a 64-bit argument first on a
// little-endian host, as the compiler assumes).
func eval(t *testing.T, f *Filter, archID uint32, nr uint32, args ...uint64) uint32 {
	t.Helper()
	data := make([]byte, 64)
	binary.BigEndian.PutUint32(data[offNr:], nr)
	binary.BigEndian.PutUint32(data[offArch:], archID)
	lo, hi := 0, 4
	if nativeBigEndian() {
		lo, hi = 4, 0
	}
	for i, a := range args {
		binary.BigEndian.PutUint32(data[16+8*i+lo:], uint32(a))
		binary.BigEndian.PutUint32(data[16+8*i+hi:], uint32(a>>32))
	}
	vm, err := bpf.NewVM(f.insts)
	if err != nil {
		t.Fatalf("NewVM: %v", err)
	}
	got, err := vm.Run(data)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return uint32(got)
}

func nativeBigEndian() bool {
	var x uint16 = 1
	return (*[2]byte)(unsafe.Pointer(&x))[0] == 0
}

// TestDefaultDecisions checks what the compiled default profile answers
// for the calls the package doc names, on this architecture.
func TestDefaultDecisions(t *testing.T) {
	f := mustDefault(t)
	info := nativeArch[runtime.GOARCH]
	const (
		newNS    = unix.CLONE_NEWNS | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC | unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWCGROUP
		thread   = unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND | unix.CLONE_THREAD | unix.CLONE_SYSVSEM | unix.CLONE_SETTLS
		sigchld  = uint64(unix.SIGCHLD)
		addrNoRa = 0x0040000 // ADDR_NO_RANDOMIZE
	)
	for _, tc := range []struct {
		name string
		call string
		args []uint64
		want uint32
	}{
		{"read", "read", nil, retAllow},
		{"openat", "openat", nil, retAllow},
		{"newfstatat (stat(2); fstatat in the compiler's arm64 table)", "newfstatat", nil, retAllow},
		{"fstat", "fstat", nil, retAllow},
		{"execve", "execve", nil, retAllow},
		{"futex", "futex", nil, retAllow},
		{"thread clone", "clone", []uint64{thread}, retAllow},
		{"fork clone", "clone", []uint64{sigchld}, retAllow},
		{"pidfd clone", "clone", []uint64{sigchld | unix.CLONE_PIDFD}, retAllow},
		{"clone new user", "clone", []uint64{sigchld | unix.CLONE_NEWUSER}, retEPERM},
		{"clone new net", "clone", []uint64{sigchld | unix.CLONE_NEWNET}, retEPERM},
		{"clone every new ns", "clone", []uint64{sigchld | newNS}, retEPERM},
		{"clone new user, high word set", "clone", []uint64{1<<40 | unix.CLONE_NEWUSER}, retEPERM},
		{"clone3", "clone3", nil, retENOSYS},
		{"unshare", "unshare", []uint64{unix.CLONE_NEWUSER}, retEPERM},
		{"unshare fs only", "unshare", []uint64{unix.CLONE_FS}, retEPERM},
		{"setns", "setns", nil, retEPERM},
		{"mount", "mount", nil, retEPERM},
		{"umount2", "umount2", nil, retEPERM},
		{"pivot_root", "pivot_root", nil, retEPERM},
		{"fsopen", "fsopen", nil, retEPERM},
		{"open_tree", "open_tree", nil, retEPERM},
		{"keyctl", "keyctl", nil, retEPERM},
		{"add_key", "add_key", nil, retEPERM},
		{"request_key", "request_key", nil, retEPERM},
		{"bpf", "bpf", nil, retEPERM},
		{"perf_event_open", "perf_event_open", nil, retEPERM},
		{"userfaultfd", "userfaultfd", nil, retEPERM},
		{"io_uring_setup", "io_uring_setup", nil, retEPERM},
		{"io_uring_enter", "io_uring_enter", nil, retEPERM},
		{"init_module", "init_module", nil, retEPERM},
		{"finit_module", "finit_module", nil, retEPERM},
		{"delete_module", "delete_module", nil, retEPERM},
		{"kexec_load", "kexec_load", nil, retEPERM},
		{"kexec_file_load", "kexec_file_load", nil, retEPERM},
		{"reboot", "reboot", nil, retEPERM},
		{"swapon", "swapon", nil, retEPERM},
		{"acct", "acct", nil, retEPERM},
		{"clock_settime", "clock_settime", nil, retEPERM},
		{"settimeofday", "settimeofday", nil, retEPERM},
		{"adjtimex stays", "adjtimex", nil, retAllow},
		{"open_by_handle_at", "open_by_handle_at", nil, retEPERM},
		{"syslog", "syslog", nil, retEPERM},
		{"sethostname", "sethostname", nil, retEPERM},
		{"ptrace, as Docker on >= 4.8", "ptrace", nil, retAllow},
		{"kcmp", "kcmp", nil, retEPERM},
		{"chroot, in Docker's default capabilities", "chroot", nil, retAllow},
		{"personality linux", "personality", []uint64{0}, retAllow},
		{"personality query", "personality", []uint64{0xffffffff}, retAllow},
		{"personality no-randomize", "personality", []uint64{addrNoRa}, retEPERM},
		{"personality query with high bits", "personality", []uint64{0xffffffff | 1<<32}, retEPERM},
		{"socket inet", "socket", []uint64{unix.AF_INET}, retAllow},
		{"socket unix", "socket", []uint64{unix.AF_UNIX}, retAllow},
		{"socket netlink", "socket", []uint64{unix.AF_NETLINK}, retAllow},
		{"socket vsock", "socket", []uint64{unix.AF_VSOCK}, retEPERM},
		{"socket alg", "socket", []uint64{unix.AF_ALG}, retEPERM},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name, ok := tableName(info, tc.call)
			nr := info.SyscallNames[name]
			if !ok {
				t.Fatalf("%s has no number on %s", tc.call, info.Name)
			}
			if got := eval(t, f, uint32(info.ID), uint32(nr), tc.args...); got != tc.want {
				t.Errorf("%s%v: got %#x, want %#x", tc.call, tc.args, got, tc.want)
			}
		})
	}
}

// TestForeignABI: a call through another ABI than the native one, or a
// number past the table, never reaches the allowlist.
func TestForeignABI(t *testing.T) {
	f := mustDefault(t)
	info := nativeArch[runtime.GOARCH]
	read := uint32(info.SyscallNames["read"])
	if got := eval(t, f, uint32(unix.AUDIT_ARCH_I386), read); got != retEPERM {
		t.Errorf("i386 read: got %#x, want %#x", got, retEPERM)
	}
	if got := eval(t, f, uint32(unix.AUDIT_ARCH_ARM), read); got != retEPERM {
		t.Errorf("arm read: got %#x, want %#x", got, retEPERM)
	}
	if got := eval(t, f, uint32(info.ID), read|0x40000000); got != retENOSYS { // x32's bit
		t.Errorf("x32 read: got %#x, want %#x", got, retENOSYS)
	}
	maxNr := 0
	for nr := range info.SyscallNumbers {
		maxNr = max(maxNr, nr)
	}
	if got := eval(t, f, uint32(info.ID), uint32(maxNr+1)); got != retENOSYS {
		t.Errorf("number %d past the table: got %#x, want %#x", maxNr+1, got, retENOSYS)
	}
	if got := eval(t, f, uint32(info.ID), 0xffffffff); got != retENOSYS {
		t.Errorf("number -1: got %#x, want %#x", got, retENOSYS)
	}
}

// TestReturnValues: the program answers only allow, EPERM or ENOSYS;
// above all never SECCOMP_RET_ERRNO with errno 0, which the caller would
// read as success.
func TestReturnValues(t *testing.T) {
	f := mustDefault(t)
	seen := map[uint32]bool{}
	for _, in := range f.insts {
		if r, ok := in.(bpf.RetConstant); ok {
			seen[r.Val] = true
			if r.Val != retAllow && r.Val != retEPERM && r.Val != retENOSYS {
				t.Errorf("program returns %#x", r.Val)
			}
		}
	}
	for _, want := range []uint32{retAllow, retEPERM, retENOSYS} {
		if !seen[want] {
			t.Errorf("program never returns %#x", want)
		}
	}
	if f.Len() != len(f.insts) || f.Len() > bpfMaxInsns {
		t.Errorf("Len %d, %d instructions, kernel limit %d", f.Len(), len(f.insts), bpfMaxInsns)
	}
	t.Logf("%d instructions; names without a number here: %v", f.Len(), f.skipped)
}

// TestCompileRefuses: a profile the compiler cannot express exactly is an
// error, never a looser filter.
func TestCompileRefuses(t *testing.T) {
	info := nativeArch[runtime.GOARCH]
	eperm := uint(unix.EPERM)
	zero := uint(0)
	base := func(rules ...specs.LinuxSyscall) *specs.LinuxSeccomp {
		return &specs.LinuxSeccomp{DefaultAction: specs.ActErrno, DefaultErrnoRet: &eperm, Syscalls: rules}
	}
	for _, tc := range []struct {
		name string
		prof *specs.LinuxSeccomp
	}{
		{"allow by default", &specs.LinuxSeccomp{DefaultAction: specs.ActAllow,
			Syscalls: []specs.LinuxSyscall{{Names: []string{"read"}, Action: specs.ActAllow}}}},
		{"kill action", base(specs.LinuxSyscall{Names: []string{"read"}, Action: specs.ActKillProcess})},
		{"errno 0", base(specs.LinuxSyscall{Names: []string{"read"}, Action: specs.ActErrno, ErrnoRet: &zero})},
		{"masked compare to non-zero", base(specs.LinuxSyscall{Names: []string{"clone"}, Action: specs.ActAllow,
			Args: []specs.LinuxSeccompArg{{Index: 0, Value: 0xff, ValueTwo: 1, Op: specs.OpMaskedEqual}}})},
		{"argument compared twice", base(specs.LinuxSyscall{Names: []string{"socket"}, Action: specs.ActAllow,
			Args: []specs.LinuxSeccompArg{{Index: 0, Value: 1, Op: specs.OpGreaterEqual}, {Index: 0, Value: 9, Op: specs.OpLessThan}}})},
		{"argument 6", base(specs.LinuxSyscall{Names: []string{"read"}, Action: specs.ActAllow,
			Args: []specs.LinuxSeccompArg{{Index: 6, Value: 1, Op: specs.OpEqualTo}}})},
		{"two actions for one call", base(
			specs.LinuxSyscall{Names: []string{"read"}, Action: specs.ActAllow},
			specs.LinuxSyscall{Names: []string{"read"}, Action: specs.ActErrno})},
		{"nothing on this architecture", base(specs.LinuxSyscall{Names: []string{"no_such_call"}, Action: specs.ActAllow})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if f, err := compile(tc.prof, info); err == nil {
				t.Fatalf("compiled to %d instructions, want an error", f.Len())
			}
		})
	}
	// And the forms it does take mean what they say.
	f, err := compile(base(
		specs.LinuxSyscall{Names: []string{"read", "no_such_call"}, Action: specs.ActAllow},
		specs.LinuxSyscall{Names: []string{"write"}, Action: specs.ActAllow,
			Args: []specs.LinuxSeccompArg{{Index: 0, Value: 2, Op: specs.OpEqualTo}}},
		specs.LinuxSyscall{Names: []string{"write"}, Action: specs.ActAllow,
			Args: []specs.LinuxSeccompArg{{Index: 0, Value: 1, Op: specs.OpEqualTo}}},
	), info)
	if err != nil {
		t.Fatalf("compile: %v", err)
	}
	write := uint32(info.SyscallNames["write"])
	for fd, want := range map[uint64]uint32{1: retAllow, 2: retAllow, 3: retEPERM} {
		if got := eval(t, f, uint32(info.ID), write, fd); got != want {
			t.Errorf("write(%d): got %#x, want %#x", fd, got, want)
		}
	}
	if len(f.skipped) != 1 || f.skipped[0] != "no_such_call" {
		t.Errorf("skipped %v, want [no_such_call]", f.skipped)
	}
}

func TestUnsupportedArchIsAnError(t *testing.T) {
	if _, ok := nativeArch[runtime.GOARCH]; !ok {
		if _, err := Default(); !errors.Is(err, ErrUnsupportedArch) {
			t.Fatalf("Default on %s: %v, want ErrUnsupportedArch", runtime.GOARCH, err)
		}
		return
	}
	// Here: the compiler refuses another architecture's table.
	other := nativeArch["arm64"]
	if runtime.GOARCH == "arm64" {
		other = nativeArch["amd64"]
	}
	eperm := uint(unix.EPERM)
	_, err := compile(&specs.LinuxSeccomp{DefaultAction: specs.ActErrno, DefaultErrnoRet: &eperm,
		Syscalls: []specs.LinuxSyscall{{Names: []string{"read"}, Action: specs.ActAllow}}}, other)
	if !errors.Is(err, ErrUnsupportedArch) {
		t.Fatalf("compile for %s on %s: %v, want ErrUnsupportedArch", other.Name, runtime.GOARCH, err)
	}
}

// deniedByOmission are the calls of the compiler's tables that the
// profile names nowhere, so the default EPERM denies them; anything else
// a table has that the profile does not name is a naming mismatch (the
// table's name differs from libseccomp's), which would deny an ordinary
// call, and needs an entry in aliases.
var deniedByOmission = map[string]bool{
	"add_key": true, "keyctl": true, "request_key": true,
	"io_uring_setup": true, "io_uring_enter": true, "io_uring_register": true,
	"kexec_load": true, "kexec_file_load": true, "swapon": true, "swapoff": true, "pivot_root": true,
	"userfaultfd": true, "migrate_pages": true, "move_pages": true, "open_tree_attr": true,
	"nfsservctl": true, "arch_specific_syscall": true,
	// x86_64's obsolete or never-implemented calls.
	"_sysctl": true, "afs_syscall": true, "create_module": true, "get_kernel_syms": true, "getpmsg": true,
	"putpmsg": true, "query_module": true, "security": true, "sysfs": true, "tuxcall": true, "uselib": true,
	"ustat": true, "vserver": true,
}

// TestTableNamesDecided checks, for every supported architecture (data
// only: the filter itself is built for the running one), that each call of
// the compiler's table is either named by the profile, through aliases, or
// one the profile leaves out on purpose.
func TestTableNamesDecided(t *testing.T) {
	named := map[string]bool{}
	for _, r := range seccomp.DefaultProfile().Syscalls {
		for _, n := range r.Names {
			named[n] = true
		}
	}
	for goarch, info := range nativeArch {
		byTable := map[string]bool{}
		for n := range named {
			if tn, ok := tableName(info, n); ok {
				byTable[tn] = true
			}
		}
		for nr, n := range info.SyscallNumbers {
			if !byTable[n] && !deniedByOmission[n] {
				t.Errorf("%s: %s (%d) is in the compiler's table but the profile names it nowhere: a name mismatch to add to aliases, or a call to list in deniedByOmission", goarch, n, nr)
			}
		}
	}
}
