package pod

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// The holder's side of what a pod's root shows beyond the system
// directories' overlays: the masks over the host's configuration and
// package state, the pod's own /etc/hosts, and the operator's binds.

// maskLayer makes, in the directory mask (on the holder's staging
// tmpfs), the top lower layer of the overlay of the host directory dir,
// whose idmapped clone is attached at lower: a whiteout (a 0/0
// character device, which an overlay reads as "no such entry", and
// which a user namespace may make) for each entry below dir that the
// holder cannot read as the host has it, without the idmap (a file not
// readable by others, a directory not listable and searchable by them),
// and the directories leading to those, each with its host directory's
// mode and owner as the idmap shows them (an overlay shows a directory
// with its topmost layer's). So the pod's root, which owns the host
// root's files through the idmap, sees none of what the host keeps from
// everybody but its root: /etc/shadow, /etc/ssl/private, debconf's
// passwords.dat. The check is the kernel's own (faccessat as the
// holder: the block's first id, no group of the host's), at each start.
func maskLayer(dir, lower, mask string) error {
	if err := os.Mkdir(mask, 0o755); err != nil {
		return err
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", dir, err)
	}
	return maskWalk(fd, dir, lower, mask, "")
}

// maskWalk masks what lies below rel (relative to dir, lower and mask),
// whose directory dfd is open (and closed here); mask/rel is made only
// when something below it is hidden. The checks are relative to dfd:
// one name looked up each, not a path.
func maskWalk(dfd int, dir, lower, mask, rel string) error {
	f := os.NewFile(uintptr(dfd), path.Join(dir, rel))
	defer f.Close()
	ents, err := f.ReadDir(-1)
	if err != nil {
		return fmt.Errorf("list %s: %w", path.Join(dir, rel), err)
	}
	for _, e := range ents {
		r := path.Join(rel, e.Name())
		need := uint32(unix.R_OK)
		switch e.Type() {
		case fs.ModeSymlink:
			continue // resolved inside the pod, against the pod's tree
		case fs.ModeDir:
			need |= unix.X_OK
		}
		err := unix.Faccessat(dfd, e.Name(), need, unix.AT_SYMLINK_NOFOLLOW)
		switch {
		case err == nil && e.IsDir():
			sub, err := unix.Openat(dfd, e.Name(), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if errors.Is(err, unix.ENOENT) {
				continue // gone since it was listed: nothing to hide
			}
			if err != nil {
				return fmt.Errorf("open %s: %w", path.Join(dir, r), err)
			}
			if err := maskWalk(sub, dir, lower, mask, r); err != nil {
				return err
			}
		case err == nil, errors.Is(err, unix.ENOENT):
		case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
			if err := maskDirs(lower, mask, rel); err != nil {
				return err
			}
			if err := unix.Mknod(path.Join(mask, r), unix.S_IFCHR, 0); err != nil {
				return fmt.Errorf("hide %s: %w", path.Join(dir, r), err)
			}
		default:
			return fmt.Errorf("check %s: %w", path.Join(dir, r), err)
		}
	}
	return nil
}

// maskDirs makes mask/rel and the directories above it (below mask)
// that are missing, each with the mode and owner lower/... has.
func maskDirs(lower, mask, rel string) error {
	if rel == "" {
		return nil
	}
	m := path.Join(mask, rel)
	if _, err := os.Lstat(m); err == nil {
		return nil
	}
	if err := maskDirs(lower, mask, path.Dir(rel)); err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Lstat(path.Join(lower, rel), &st); err != nil {
		return fmt.Errorf("stat %s: %w", rel, err)
	}
	if err := unix.Mkdir(m, 0o700); err != nil {
		return err
	}
	if st.Uid < BlockSize && st.Gid < BlockSize {
		if err := unix.Lchown(m, int(st.Uid), int(st.Gid)); err != nil {
			return fmt.Errorf("chown %s: %w", m, err)
		}
	}
	return unix.Chmod(m, st.Mode&0o7777)
}

// hostsFile is a pod's /etc/hosts: its host name resolves (sudo,
// `hostname -f`, Java's getLocalHost ask), and nothing of the host's own
// file (its name, its private services) is shown.
const hostsFile = "127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\tlocalhost ip6-localhost ip6-loopback\n"

// podHosts writes the pod's /etc/hosts in root (through its overlay,
// into the upper layer up) unless the upper layer holds one already
// (an earlier start's, maybe edited by root inside: it is kept).
func podHosts(root, up, name string) error {
	for _, own := range []string{"etc/upper/hosts", "root/upper/etc/hosts"} {
		if err := existsBeneath(up, own); !errors.Is(err, unix.ENOENT) {
			return nil // there, or not ours to judge (a link): left as it is
		}
	}
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(rfd)
	efd, err := unix.Openat2(rfd, "etc", &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS})
	if errors.Is(err, unix.ENOENT) {
		return nil // a root file system without /etc: none is made
	}
	if err != nil {
		return err
	}
	etc := mountPoint{efd}
	defer etc.close()
	// The lower layer's (the host's file, or a link) goes: a whiteout
	// in the upper layer, then the pod's own file.
	if err := unix.Unlinkat(etc.fd, "hosts", 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	fd, err := unix.Openat(etc.fd, "hosts", unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), "hosts")
	_, err = fmt.Fprintf(f, hostsFile, name)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// existsBeneath looks rel up beneath root without following any
// symlink: nil when it is there, ENOENT when it is not.
func existsBeneath(root, rel string) error {
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(rfd)
	fd, err := unix.Openat2(rfd, rel, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS})
	if err == nil {
		unix.Close(fd)
	}
	return err
}

// bindInto attaches the bind's detached mount (fd, the holder's clone of
// what Create staged: read-only unless writable, nosuid, nodev, those
// flags locked) at its target in the new root. The mount point is made inside the root and never through a
// symlink (target): a missing directory or file is made (in the pod's
// upper layer, or a tmpfs of the pod's); a symlink where a file is
// expected (the host's /etc/resolv.conf commonly is one) is replaced by
// an empty file, in the pod's own layer.
func bindInto(root string, b planBind, fd int) error {
	t := b.Target
	if !path.IsAbs(t) || path.Clean(t) != t || t == "/" || strings.Contains(t, "\x00") {
		return fmt.Errorf("bad target %q", t)
	}
	var mp mountPoint
	var err error
	if b.Dir {
		mp, err = target(root, t)
	} else {
		mp, err = fileTarget(root, t)
	}
	if err != nil {
		return fmt.Errorf("make mount point: %w", err)
	}
	defer mp.close()
	if err := unix.MoveMount(fd, "", mp.fd, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach: %w", err)
	}
	return nil
}

// fileTarget opens (making it if missing, replacing a symlink) the file
// rel beneath root as a mount point, its directory opened by target.
func fileTarget(root, rel string) (mountPoint, error) {
	dir, err := target(root, path.Dir(rel))
	if err != nil {
		return mountPoint{}, err
	}
	defer dir.close()
	name := path.Base(rel)
	how := &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS}
	for try := 0; ; try++ {
		fd, err := unix.Openat2(dir.fd, name, how)
		if err == nil {
			var st unix.Stat_t
			if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT == unix.S_IFDIR {
				unix.Close(fd)
				return mountPoint{}, fmt.Errorf("%s is a directory, the bind's source a file", rel)
			}
			return mountPoint{fd}, nil
		}
		if try > 0 {
			return mountPoint{}, err
		}
		switch {
		case errors.Is(err, unix.ELOOP):
			if err := unix.Unlinkat(dir.fd, name, 0); err != nil {
				return mountPoint{}, err
			}
		case !errors.Is(err, unix.ENOENT):
			return mountPoint{}, err
		}
		nfd, err := unix.Openat(dir.fd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
		if err != nil {
			return mountPoint{}, err
		}
		unix.Close(nfd)
	}
}
