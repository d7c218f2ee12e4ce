package shim

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	podpkg "github.com/agentrunner/runner/pod"
	"github.com/agentrunner/runner/shim/sessiondir"
	"github.com/creack/pty"
	"golang.org/x/sys/unix"
)

// openPTY opens a pseudo-terminal pair with github.com/creack/pty, sized
// rows x cols. The master must be non-blocking so that its *os.File uses
// the runtime poller (read/write deadlines work, which the drain window
// and stdin cancellation rely on), but pty.Open and pty.Setsize reach the
// descriptor through Fd(), which leaves it blocking; so, once the library
// has opened, unlocked and sized the pair, the master's descriptor is
// duplicated, made non-blocking and wrapped anew (the original closed).
// Opening /dev/ptmx never makes it a controlling terminal, so the shim
// gets none; the slave is opened O_NOCTTY by the library and is for the
// child only, which takes it as its controlling terminal at the fork
// (SysProcAttr Setsid and Setctty, as the library's own Start sets them;
// the start itself is the exec path's, not the library's).
//
// A session in a pod (pod not nil) gets its terminal from the pod's own
// devpts instance, as runc's console does, so that the command finds it
// at /dev/pts/N inside (ttyname, tty(1), tmux, ssh): the master is
// opened through the holder's root, /proc/PID/root/dev/pts/ptmx, never
// following a link (openat2 RESOLVE_NO_SYMLINKS) and checked to be a
// devpts ptmx, the holder checked by its start time around the open;
// the slave comes from the master (TIOCGPTPEER), with no path lookup.
func openPTY(rows, cols uint16, pod *sessiondir.PodRef) (master, slave *os.File, err error) {
	var m, s *os.File
	if pod != nil {
		m, s, err = openPodPTY(pod)
	} else {
		m, s, err = pty.Open()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("open pty: %w", err)
	}
	defer m.Close()
	if err := pty.Setsize(m, &pty.Winsize{Rows: rows, Cols: cols}); err != nil {
		s.Close()
		return nil, nil, fmt.Errorf("set terminal size: %w", err)
	}
	fd, err := unix.FcntlInt(m.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		s.Close()
		return nil, nil, fmt.Errorf("duplicate pty master: %w", err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		s.Close()
		return nil, nil, fmt.Errorf("make pty master non-blocking: %w", err)
	}
	return os.NewFile(uintptr(fd), "/dev/ptmx"), s, nil
}

// openPodPTY opens a pty pair of the devpts instance of pod's holder.
func openPodPTY(pod *sessiondir.PodRef) (master, slave *os.File, err error) {
	root, err := unix.Open(fmt.Sprintf("/proc/%d/root", pod.PID), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open the pod's root: %w", err)
	}
	defer unix.Close(root)
	if err := podStillThere(pod); err != nil {
		return nil, nil, err
	}
	fd, err := unix.Openat2(root, "dev/pts/ptmx", &unix.OpenHow{
		Flags:   unix.O_RDWR | unix.O_NOCTTY | unix.O_NONBLOCK | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_BENEATH,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("open the pod's /dev/pts/ptmx: %w", err)
	}
	m := os.NewFile(uintptr(fd), "/dev/pts/ptmx")
	var sfs unix.Statfs_t
	var st unix.Stat_t
	if err := unix.Fstatfs(fd, &sfs); err != nil || sfs.Type != unix.DEVPTS_SUPER_MAGIC ||
		unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Major(st.Rdev) != 5 || unix.Minor(st.Rdev) != 2 {
		m.Close()
		return nil, nil, fmt.Errorf("the pod's /dev/pts/ptmx is not a devpts ptmx")
	}
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		m.Close()
		return nil, nil, fmt.Errorf("unlock pty: %w", err)
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		m.Close()
		return nil, nil, err
	}
	r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TIOCGPTPEER, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC)
	if errno != 0 {
		m.Close()
		return nil, nil, fmt.Errorf("open pty slave: %w", errno)
	}
	if err := podStillThere(pod); err != nil {
		m.Close()
		unix.Close(int(r))
		return nil, nil, err
	}
	return m, os.NewFile(r, "/dev/pts/slave"), nil
}

// podStillThere says the holder pod names still runs: its pid is not
// another process's.
func podStillThere(pod *sessiondir.PodRef) error {
	if st, err := podpkg.StartTimeOf(pod.PID); err != nil || st != pod.StartTime {
		return fmt.Errorf("pod %d: %w", pod.PID, syscall.ESRCH)
	}
	return nil
}

// resizePTY sets the terminal size of master's pair, which also sends
// SIGWINCH to the terminal's foreground process group. pty.Setsize takes
// the slave side (TIOCSWINSZ acts on the one terminal either way): a
// slave descriptor fetched from the master itself (TIOCGPTPEER, no path
// lookup), so master stays non-blocking.
func resizePTY(master *os.File, rows, cols uint16) error {
	var peer int
	if err := withFd(master, func(fd int) error {
		r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TIOCGPTPEER, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC)
		if errno != 0 {
			return errno
		}
		peer = int(r)
		return nil
	}); err != nil {
		return fmt.Errorf("open terminal peer: %w", err)
	}
	return setSize(os.NewFile(uintptr(peer), "pty peer"), rows, cols)
}

func setSize(f *os.File, rows, cols uint16) error {
	defer f.Close()
	if err := pty.Setsize(f, &pty.Winsize{Rows: rows, Cols: cols}); err != nil {
		return fmt.Errorf("set terminal size: %w", err)
	}
	return nil
}

// withFd runs fn with f's descriptor without switching f to blocking mode
// (f.Fd() would, and deadlines would stop working).
func withFd(f *os.File, fn func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// veofChar returns the terminal's EOF character (VEOF, ^D by default) and
// whether the line discipline is canonical.
func veofChar(master *os.File) (byte, bool) {
	c, canon := byte(4), true
	_ = withFd(master, func(fd int) error {
		t, err := unix.IoctlGetTermios(fd, unix.TCGETS)
		if err != nil {
			return err
		}
		if v := t.Cc[unix.VEOF]; v != 0 {
			c = v
		}
		canon = t.Lflag&unix.ICANON != 0
		return nil
	})
	return c, canon
}

// lookPath resolves argv0 the way a shell would, but with the command's
// own PATH (from env) rather than the shim's.
func lookPath(argv0 string, env []string, dir string) (string, error) {
	if strings.Contains(argv0, "/") {
		p := argv0
		if !filepath.IsAbs(p) && dir != "" {
			p = filepath.Join(dir, p)
		}
		if err := executable(p); err != nil {
			return "", &os.PathError{Op: "exec", Path: argv0, Err: err}
		}
		return p, nil
	}
	path := sessiondir.DefaultPath
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	var firstErr error = syscall.ENOENT
	for _, d := range filepath.SplitList(path) {
		if d == "" {
			d = "."
		}
		if !filepath.IsAbs(d) && dir != "" {
			d = filepath.Join(dir, d)
		}
		p := filepath.Join(d, argv0)
		err := executable(p)
		if err == nil {
			return p, nil
		}
		if !errors.Is(err, syscall.ENOENT) && !errors.Is(err, syscall.ENOTDIR) && firstErr == syscall.ENOENT {
			firstErr = err
		}
	}
	return "", &os.PathError{Op: "exec", Path: argv0, Err: firstErr}
}

func executable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			return pe.Err
		}
		return err
	}
	if fi.IsDir() {
		return syscall.EISDIR
	}
	if fi.Mode()&0o111 == 0 {
		return syscall.EACCES
	}
	return nil
}
