// Package storage is runnerd's storage pool: the disk a sandbox writes
// to, as volumes whose size (and, where the driver can, inode count) the
// kernel bounds, behind a small driver seam as Incus has it.
//
// A [Pool] is opened on a directory under runnerd's state ([Open]) with
// one driver, and holds one volume per sandbox: [Pool.Create] (get or
// create), [Pool.Grow] (grow only), [Pool.Usage], [Pool.Snapshot] and
// [Pool.Clone] where the driver has native snapshots, [Pool.Delete]
// (absent is success). The drivers:
//
//   - "btrfs": one pool file on a loop device (sized by [Config.Size]),
//     quotas enabled, a subvolume and a qgroup limit on referenced bytes
//     per volume. Snapshots and clones are btrfs snapshots (milliseconds,
//     whatever the data size; blocks shared until written). btrfs has no
//     inode limit: a non-zero [Limits.Inodes] is refused with
//     [ErrNotSupported], never accepted and ignored. The budget holds
//     only for commands that cannot create a subvolume: a nested
//     subvolume gets a quota group of its own, outside the volume's
//     limit, and creating one needs nothing but write access. The
//     sandbox's seccomp filter (package seccomp) denies the subvolume and
//     snapshot ioctls, so a command under it cannot; a command not under
//     it can escape the budget (see hostile_test.go).
//   - "ext4": an image file per volume, made by mkfs.ext4 with the
//     inode count asked for (-N; the kernel may hold a few more, which
//     the returned [Volume.Limits] says), loop-mounted; Grow extends the
//     file and resizes the mounted file system (resize2fs). Every byte
//     and inode written inside counts. No snapshots.
//   - "dir": a plain directory. It holds no budget: a non-zero limit is
//     refused with [ErrNotSupported] and [Pool.Budgets] is false, so
//     runnerd can say at start that budgets are off.
//
// [DefaultDriver] picks btrfs where mkfs.btrfs and btrfs(8) are installed
// and the kernel has btrfs and loop devices, ext4 where mkfs.ext4 and
// resize2fs are, and dir otherwise, and says why.
//
// Loop devices are attached with LOOP_CTL_GET_FREE and LOOP_CONFIGURE
// with LO_FLAGS_AUTOCLEAR and mounted with mount(2), so a device is
// freed by the kernel when its mount goes (or at once when the mount
// fails): no device outlives its mount, whoever crashes. The pool's
// directory is made a shared mount (bound on itself), so that unmounting
// a volume also unmounts the copies that mount namespaces made since
// (every sandboxed spawn makes one, as slave) took of it; otherwise each
// copy would hold the file system and its loop device until its
// namespace ended. The file system
// tools (mkfs.btrfs, mkfs.ext4, resize2fs, btrfs) are run as programs:
// they are the file systems' own, maintained with the kernel code, and
// no Go library makes or resizes them.
//
// # Crash safety and adoption
//
// Each volume has a record (a small JSON file in the pool's directory):
// Create writes it in state "creating" before it touches the driver and
// marks it "ready" last; Delete removes it first. [Open] therefore
// finishes every interrupted operation by removing: a volume whose
// record says "creating" (a Create that never answered) and a driver
// volume with no record (a Delete cut short) are deleted. Volumes stay
// mounted across [Pool.Close]; Open on the same directory adopts the
// mounted pool and volumes and mounts what is not mounted (after a
// reboot), without attaching a second loop device. [Pool.Destroy]
// removes every volume, unmounts and frees everything.
//
// The pool runs as root and never follows a path a sandbox can change:
// it only stats and unmounts mount points it made, finds nested btrfs
// subvolumes by searching the root tree (never by parsing names, which
// are the sandbox's) and deletes them by id, not by path.
package storage
