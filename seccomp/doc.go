// Package seccomp is the system-call filter of an isolated command
// (sessiondir.Spec.Isolate): Docker's default seccomp profile, compiled to a
// classic BPF program in pure Go and installed just before the command's
// execve(2), so the command and everything it starts run under it.
//
// # What it is built from, and why
//
// The profile is the data of github.com/moby/profiles/seccomp (the
// default.json that Docker, containerd and Podman ship), resolved for the
// running kernel and for a container holding Docker's default capability
// set ([dockerCaps]), whatever capabilities the command really has: a
// command that is root inside its own user namespace has every capability
// there, and the profile must not open up because of it. The compiler is
// github.com/elastic/go-seccomp-bpf (argument conditions included), over
// golang.org/x/net/bpf. Both are pure Go, so the in-guest runner-shim
// still builds with CGO_ENABLED=0; libseccomp (what runc uses) would need
// cgo and a C library in every image.
//
// # What is denied
//
// Everything not on the profile's allowlist, which is what a container
// without CAP_SYS_ADMIN and the other privileged capabilities gets:
//
//   - new namespaces: unshare(2) and setns(2) entirely; clone(2) with any
//     CLONE_NEW* flag (CLONE_NEWUSER above all: `unshare -U -r` is how
//     most container escapes reach a kernel bug with full capabilities);
//   - mounts: mount, umount2, the new mount API (fsopen, fsmount,
//     move_mount, open_tree, ...), pivot_root; the sandbox's mounts are made
//     before the filter, by the shim;
//   - the kernel keyring: keyctl, add_key, request_key;
//   - bpf, perf_event_open, userfaultfd, io_uring_setup/enter/register
//     (current Docker dropped io_uring from the default: most of its
//     2022-2023 kernel bugs were reachable unprivileged);
//   - modules (init_module, finit_module, delete_module), kexec_load,
//     kexec_file_load, reboot, swapon, swapoff, acct, quotactl;
//   - the clock: clock_settime, settimeofday, stime (adjtimex and
//     clock_adjtime stay: the kernel itself refuses their writes without
//     CAP_SYS_TIME, and chronyd-style readers need them);
//   - personality(2) other than the five personas Docker allows (no
//     ADDR_NO_RANDOMIZE, no READ_IMPLIES_EXEC);
//   - open_by_handle_at (the "shocker" escape), lookup_dcookie, syslog,
//     sethostname, setdomainname, vhangup, iopl, ioperm, the LSM
//     self-attribute calls, the NUMA memory-policy calls, and kcmp,
//     pidfd_getfd and process_madvise (which Docker gates on
//     CAP_SYS_PTRACE);
//   - socket(2) of the address families Docker blocks (AF_VSOCK, AF_ALG);
//   - beyond Docker's profile, the btrfs ioctls that create or destroy a
//     subvolume or snapshot (BTRFS_IOC_SUBVOL_CREATE, _V2,
//     BTRFS_IOC_SNAP_CREATE, _V2, BTRFS_IOC_SNAP_DESTROY, _V2): creating
//     a subvolume needs only write access, and a nested subvolume has a
//     quota group of its own outside its volume's limit, so without this
//     a command escapes the storage pool's btrfs budget (package
//     storage). The request is compared on its low 32 bits, as the
//     kernel reads it.
//
// ptrace(2), process_vm_readv and process_vm_writev are allowed, as Docker
// allows them on kernels from 4.8 (where a tracer can no longer step a
// tracee past the filter): what keeps a command from tracing outside its
// sandbox is the kernel's own access check (another uid, no
// CAP_SYS_PTRACE, and with the isolation work another pid namespace).
//
// # Errno, not a kill
//
// A denied call fails with EPERM, as in Docker: programs treat it as "not
// allowed here" and carry on (a build that probes for keyctl, a shell that
// tries a namespace). Two cases answer ENOSYS instead, so that a C
// library falls back as it would on an older kernel: clone3(2), whose
// flags live in memory the filter cannot read (glibc and musl then use
// clone(2), whose flags it checks), and every system call number past the
// last one the compiler's table knows (a kernel newer than the table; runc
// does the same). A call made through a foreign ABI (i386 int 0x80 on
// x86_64, x32, AArch32 on arm64) fails with EPERM or ENOSYS: only the
// native ABI is allowed, which is stricter than Docker.
//
// # Architectures
//
// x86_64 and arm64 (aarch64). On any other architecture [Default] returns
// [ErrUnsupportedArch], and an isolated start fails: a filter that cannot
// be built is refused, never silently skipped.
//
// # Compiled once
//
// [Filter.MarshalBinary] encodes a compiled program (the raw sock_filter
// array, behind a versioned header, with a SHA-256 over it; program.go)
// and [Decode] turns those bytes back into a [Filter] without compiling,
// refusing anything not intact ([ErrCorrupt]). runnerd's shim launcher
// (shim/launch) compiles the profile once per process and hands every
// shim the bytes in its spec; each start's helper checks and loads them:
// resolving and compiling the profile (0.3-0.9 ms, and the memory a
// compile leaves in a shim) is off the start's path.
//
// # Invariants
//
//   - [Filter.Load] installs the filter on every thread of the calling
//     process (SECCOMP_FILTER_FLAG_TSYNC) and only when no_new_privs is
//     already set on the calling thread ([ErrNoNewPrivs] otherwise): the
//     shim's helper sets it as the last privilege step, so the filter can
//     never be the thing that lets a setuid program gain privileges.
//   - A filter once loaded cannot be removed or widened by the command; a
//     command may add filters of its own, which can only deny more.
package seccomp
