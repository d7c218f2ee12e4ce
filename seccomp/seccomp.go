package seccomp

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"unsafe"

	bpfseccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"github.com/moby/profiles/seccomp"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// ErrUnsupportedArch is returned by [Default] on an architecture other
// than x86_64 and arm64: no filter is built, and the caller must refuse
// to run the command rather than run it unfiltered.
var ErrUnsupportedArch = errors.New("seccomp: architecture not supported")

// ErrNoNewPrivs is returned by [Filter.Load] when the calling thread has
// not set no_new_privs.
var ErrNoNewPrivs = errors.New("seccomp: no_new_privs is not set")

// dockerCaps is the capability set the profile is resolved for: Docker's
// default for a container (moby oci/caps.DefaultCapabilities). The
// profile's capability-gated rules (mount and unshare with CAP_SYS_ADMIN,
// clock calls with CAP_SYS_TIME, ...) stay closed for any command,
// whatever capabilities it holds in its own user namespace.
var dockerCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// nativeArch is the compiler's description of each supported GOARCH.
var nativeArch = map[string]*arch.Info{
	"amd64": arch.X86_64,
	"arm64": arch.AARCH64,
}

// Filter is a compiled seccomp program for this architecture. It is
// immutable and safe for concurrent use.
type Filter struct {
	insts []bpf.Instruction
	raw   []unix.SockFilter
	// skipped are the profile's names this architecture has no number
	// for (32-bit-only calls such as _llseek, or other architectures').
	skipped []string
}

// Default compiles Docker's default profile for the running kernel and
// architecture (see the package doc). It returns [ErrUnsupportedArch] on
// an architecture it does not handle.
func Default() (*Filter, error) {
	info, ok := nativeArch[runtime.GOARCH]
	if !ok {
		return nil, fmt.Errorf("%w: %s (x86_64 and arm64 are)", ErrUnsupportedArch, runtime.GOARCH)
	}
	prof, err := seccomp.GetDefaultProfile(&specs.Spec{Process: &specs.Process{
		Capabilities: &specs.LinuxCapabilities{Bounding: dockerCaps}}})
	if err != nil {
		return nil, fmt.Errorf("seccomp: resolve the default profile: %w", err)
	}
	return compile(prof, info)
}

// Len is the number of BPF instructions of the program.
func (f *Filter) Len() int { return len(f.raw) }

// Load installs f on every thread of the calling process. The calling
// thread must have set no_new_privs ([ErrNoNewPrivs] otherwise); the
// filter then holds for it and for every program it executes.
func (f *Filter) Load() error {
	nnp, err := unix.PrctlRetInt(unix.PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0)
	if err != nil {
		return fmt.Errorf("seccomp: read no_new_privs: %w", err)
	}
	if nnp != 1 {
		return ErrNoNewPrivs
	}
	prog := unix.SockFprog{Len: uint16(len(f.raw)), Filter: &f.raw[0]}
	// TSYNC: the Go runtime's other threads get the filter too, so no
	// code of this process runs unfiltered from here, not only the thread
	// that will execve.
	r, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER,
		unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&prog)))
	runtime.KeepAlive(f)
	if errno != 0 {
		return fmt.Errorf("seccomp: load filter: %w", errno)
	}
	if r != 0 {
		// TSYNC's answer when a thread cannot take the filter: its id.
		return fmt.Errorf("seccomp: load filter: thread %d could not be synchronised", r)
	}
	return nil
}

// compile turns a resolved OCI profile into a program for info's
// architecture: a preamble (foreign ABI: EPERM; a number past the table:
// ENOSYS), then the profile's rules, grouped by action, then its default.
func compile(prof *specs.LinuxSeccomp, info *arch.Info) (*Filter, error) {
	if prof.DefaultAction != specs.ActErrno {
		return nil, fmt.Errorf("seccomp: default action %q: only an errno is supported", prof.DefaultAction)
	}
	defErrno := uint(unix.EPERM)
	if prof.DefaultErrnoRet != nil {
		defErrno = *prof.DefaultErrnoRet
	}
	if defErrno != uint(unix.EPERM) {
		// The compiler's default can only be a bare action; its bare
		// errno action is EPERM.
		return nil, fmt.Errorf("seccomp: default errno %d: only EPERM is supported", defErrno)
	}
	f := &Filter{}
	policy := bpfseccomp.Policy{DefaultAction: bpfseccomp.ActionErrno}
	// One group per action, in the order the profile first names it; a
	// name unconditional in a group drops its conditions there.
	groupOf := map[bpfseccomp.Action]int{}
	actionOf := map[string]bpfseccomp.Action{} // name -> the group that has it
	unconditional := map[string]bool{}
	for _, rule := range prof.Syscalls {
		act, err := ruleAction(rule, defErrno)
		if err != nil {
			return nil, err
		}
		conds, err := conditions(rule.Args)
		if err != nil {
			return nil, fmt.Errorf("seccomp: rule for %v: %w", rule.Names, err)
		}
		gi, ok := groupOf[act]
		if !ok {
			gi = len(policy.Syscalls)
			groupOf[act] = gi
			policy.Syscalls = append(policy.Syscalls, bpfseccomp.SyscallGroup{Action: act})
		}
		g := &policy.Syscalls[gi]
		for _, name := range rule.Names {
			name, known := tableName(info, name)
			if !known {
				if !slices.Contains(f.skipped, name) {
					f.skipped = append(f.skipped, name)
				}
				continue
			}
			if other, seen := actionOf[name]; seen && other != act {
				// Which rule wins would depend on the compiler's order;
				// the profile must say one thing per call.
				return nil, fmt.Errorf("seccomp: %s has rules with two actions", name)
			}
			actionOf[name] = act
			switch {
			case unconditional[name]:
			case conds == nil:
				unconditional[name] = true
				g.Names = append(g.Names, name)
				g.NamesWithCondtions = slices.DeleteFunc(g.NamesWithCondtions,
					func(n bpfseccomp.NameWithConditions) bool { return n.Name == name })
			default:
				g.NamesWithCondtions = append(g.NamesWithCondtions,
					bpfseccomp.NameWithConditions{Name: name, Conditions: conds})
			}
		}
	}
	policy.Syscalls = slices.DeleteFunc(policy.Syscalls, func(g bpfseccomp.SyscallGroup) bool {
		return len(g.Names)+len(g.NamesWithCondtions) == 0
	})
	if len(policy.Syscalls) == 0 {
		return nil, errors.New("seccomp: the profile allows nothing on this architecture")
	}
	// The compiler assembles for the running architecture, which Default
	// chose info by.
	if native, err := arch.GetInfo(""); err != nil || native != info {
		return nil, fmt.Errorf("%w: the compiler targets %s only", ErrUnsupportedArch, runtime.GOARCH)
	}
	body, err := policy.Assemble()
	if err != nil {
		return nil, fmt.Errorf("seccomp: assemble: %w", err)
	}
	f.insts = append(preamble(info, defErrno), body...)
	raw, err := bpf.Assemble(f.insts)
	if err != nil {
		return nil, fmt.Errorf("seccomp: assemble: %w", err)
	}
	if len(raw) > bpfMaxInsns {
		return nil, fmt.Errorf("seccomp: the program has %d instructions, the kernel takes %d", len(raw), bpfMaxInsns)
	}
	for _, r := range raw {
		f.raw = append(f.raw, unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K})
	}
	return f, nil
}

// aliases maps, per architecture, a name the profile uses (libseccomp's,
// from the kernel's unistd.h) to the one the compiler's table has for the
// same number. Without it the call would be denied: on arm64 that is
// stat(2) itself. TestTableNamesDecided finds any new mismatch.
var aliases = map[string]map[string]string{
	"aarch64": {"newfstatat": "fstatat"}, // 79
}

// tableName returns the compiler's name for the profile's name on info's
// architecture, and whether the table has it.
func tableName(info *arch.Info, name string) (string, bool) {
	if a, ok := aliases[info.Name][name]; ok {
		name = a
	}
	_, ok := info.SyscallNames[name]
	return name, ok
}

// bpfMaxInsns is the kernel's limit on a classic BPF program (BPF_MAXINSNS).
const bpfMaxInsns = 4096

// seccomp_data offsets (linux/seccomp.h).
const (
	offNr   = 0
	offArch = 4
)

// preamble refuses a foreign ABI with the default errno and answers
// ENOSYS for a number past the table (the x32 ABI's numbers, which carry
// bit 30, among them), answers EPERM to the btrfs subvolume ioctls
// (deniedIoctls: a rule of the request's low 32 bits, which the
// compiler's conditions cannot express), then hands on to the compiler's
// program, which loads what it needs itself.
func preamble(info *arch.Info, defErrno uint) []bpf.Instruction {
	maxNr := 0
	for nr := range info.SyscallNumbers {
		maxNr = max(maxNr, nr)
	}
	p := []bpf.Instruction{
		bpf.LoadAbsolute{Off: offArch, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(info.ID), SkipTrue: 1},
		bpf.RetConstant{Val: uint32(errnoAction(defErrno))},
		bpf.LoadAbsolute{Off: offNr, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpGreaterThan, Val: uint32(maxNr), SkipFalse: 1},
		bpf.RetConstant{Val: uint32(errnoAction(uint(unix.ENOSYS)))},
	}
	return append(p, deniedIoctls(info)...)
}

// The btrfs ioctls that make or remove a subvolume or snapshot
// (linux/btrfs.h: _IOW(0x94, nr, struct btrfs_ioctl_vol_args{,_v2}),
// both structs 4096 bytes). Creating a subvolume needs only write access
// to a directory, and a nested subvolume gets a quota group of its own
// with no limit: a command in a btrfs volume limited to 20 MiB wrote
// 60 MiB past it that way (docs/isolation.md, "A hole found while
// designing"). The storage pool's btrfs driver holds its budget only
// because a sandboxed command cannot make one.
const (
	btrfsIocSnapCreate     = 0x50009401 // BTRFS_IOC_SNAP_CREATE
	btrfsIocSubvolCreate   = 0x5000940e // BTRFS_IOC_SUBVOL_CREATE
	btrfsIocSnapDestroy    = 0x5000940f // BTRFS_IOC_SNAP_DESTROY
	btrfsIocSnapCreateV2   = 0x50009417 // BTRFS_IOC_SNAP_CREATE_V2
	btrfsIocSubvolCreateV2 = 0x50009418 // BTRFS_IOC_SUBVOL_CREATE_V2
	btrfsIocSnapDestroyV2  = 0x5000943f // BTRFS_IOC_SNAP_DESTROY_V2
	offArgs                = 16         // seccomp_data.args[0]
	argSize                = 8
)

// deniedBtrfsIoctls are the ioctl(2) requests the filter answers with
// EPERM (see the constants' comment); Docker's profile allows every
// ioctl.
var deniedBtrfsIoctls = []uint32{
	btrfsIocSnapCreate, btrfsIocSubvolCreate, btrfsIocSnapDestroy,
	btrfsIocSnapCreateV2, btrfsIocSubvolCreateV2, btrfsIocSnapDestroyV2,
}

// deniedIoctls answers EPERM to ioctl(2) with a request of
// deniedBtrfsIoctls. It compares the low 32 bits of the request only:
// the kernel takes the request as an unsigned int and drops the high
// bits, so a comparison of all 64 (what the compiler's Equal does) would
// let a caller through with garbage in them. It runs after the preamble
// has loaded the call's number, and leaves the accumulator to the
// compiler's program, which loads what it needs itself.
func deniedIoctls(info *arch.Info) []bpf.Instruction {
	lo := uint32(offArgs + argSize) // args[1], low word on little endian
	if bigEndian() {
		lo += 4
	}
	n := len(deniedBtrfsIoctls)
	block := []bpf.Instruction{bpf.LoadAbsolute{Off: lo, Size: 4}}
	for i, req := range deniedBtrfsIoctls {
		// On a match, skip the remaining compares and the jump over the
		// return.
		block = append(block, bpf.JumpIf{Cond: bpf.JumpEqual, Val: req, SkipTrue: uint8(n - i)})
	}
	block = append(block,
		bpf.Jump{Skip: 1},
		bpf.RetConstant{Val: uint32(errnoAction(uint(unix.EPERM)))})
	return append([]bpf.Instruction{
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(info.SyscallNames["ioctl"]), SkipFalse: uint8(len(block))},
	}, block...)
}

// bigEndian reports whether the running machine stores words big end
// first (the kernel fills seccomp_data in native order).
func bigEndian() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 0
}

// errnoAction is SECCOMP_RET_ERRNO with errno in its data; never errno 0,
// which would make a denied call return success.
func errnoAction(errno uint) bpfseccomp.Action {
	return bpfseccomp.Action(uint32(bpfseccomp.ActionErrno) | uint32(errno)&unix.SECCOMP_RET_DATA)
}

func ruleAction(rule specs.LinuxSyscall, defErrno uint) (bpfseccomp.Action, error) {
	switch rule.Action {
	case specs.ActAllow:
		return bpfseccomp.ActionAllow, nil
	case specs.ActErrno:
		e := defErrno
		if rule.ErrnoRet != nil {
			e = *rule.ErrnoRet
		}
		if e == 0 {
			return 0, fmt.Errorf("seccomp: rule for %v: errno 0 would report success", rule.Names)
		}
		return errnoAction(e), nil
	}
	return 0, fmt.Errorf("seccomp: rule for %v: action %q is not supported", rule.Names, rule.Action)
}

// conditions converts a rule's argument comparisons, which all must hold
// (libseccomp's meaning); nil for none.
func conditions(args []specs.LinuxSeccompArg) (bpfseccomp.ArgumentConditions, error) {
	var out bpfseccomp.ArgumentConditions
	var seen [6]bool
	for _, a := range args {
		if a.Index > 5 {
			return nil, fmt.Errorf("argument %d does not exist", a.Index)
		}
		if seen[a.Index] {
			// runc reads two comparisons of one argument as "either",
			// libseccomp as "both": refuse rather than guess.
			return nil, fmt.Errorf("argument %d compared twice", a.Index)
		}
		seen[a.Index] = true
		c := bpfseccomp.Condition{Argument: uint32(a.Index), Value: a.Value}
		switch a.Op {
		case specs.OpEqualTo:
			c.Operation = bpfseccomp.Equal
		case specs.OpNotEqual:
			c.Operation = bpfseccomp.NotEqual
		case specs.OpLessThan:
			c.Operation = bpfseccomp.LessThan
		case specs.OpLessEqual:
			c.Operation = bpfseccomp.LessOrEqual
		case specs.OpGreaterThan:
			c.Operation = bpfseccomp.GreaterThan
		case specs.OpGreaterEqual:
			c.Operation = bpfseccomp.GreaterOrEqual
		case specs.OpMaskedEqual:
			// (arg & mask) == 0 is the one masked form the compiler has.
			if a.ValueTwo != 0 {
				return nil, fmt.Errorf("masked compare of argument %d with a non-zero result", a.Index)
			}
			c.Operation = bpfseccomp.BitsNotSet
		default:
			return nil, fmt.Errorf("operator %q is not supported", a.Op)
		}
		out = append(out, c)
	}
	return out, nil
}
