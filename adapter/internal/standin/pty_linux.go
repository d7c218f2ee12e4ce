package standin

import (
	"fmt"
	"os"
	"strconv"
	"syscall"
	"unsafe"
)

// OpenPTY opens a pseudo-terminal pair with the standard library alone
// (the stand-ins may not depend on a PTY library): /dev/ptmx, unlock,
// name, open the slave, set the size.
func OpenPTY(rows, cols uint16) (master, slave *os.File, err error) {
	master, err = os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open /dev/ptmx: %w", err)
	}
	var n uint32
	var unlock int32
	err = control(master, func(fd uintptr) error {
		if err := ioctl(fd, syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); err != nil {
			return fmt.Errorf("unlock pty: %w", err)
		}
		if err := ioctl(fd, syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); err != nil {
			return fmt.Errorf("name pty: %w", err)
		}
		return nil
	})
	if err != nil {
		master.Close()
		return nil, nil, err
	}
	slave, err = os.OpenFile("/dev/pts/"+strconv.Itoa(int(n)), os.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("open pty slave: %w", err)
	}
	if err := SetPTYSize(master, rows, cols); err != nil {
		master.Close()
		slave.Close()
		return nil, nil, err
	}
	return master, slave, nil
}

// SetPTYSize sets the terminal size (TIOCSWINSZ).
func SetPTYSize(master *os.File, rows, cols uint16) error {
	ws := struct{ rows, cols, x, y uint16 }{rows, cols, 0, 0}
	return control(master, func(fd uintptr) error {
		if err := ioctl(fd, syscall.TIOCSWINSZ, uintptr(unsafe.Pointer(&ws))); err != nil {
			return fmt.Errorf("set pty size: %w", err)
		}
		return nil
	})
}

// control runs fn on f's descriptor without taking it out of Go's poller
// (f.Fd() would switch it to blocking mode).
func control(f *os.File, fn func(fd uintptr) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var inner error
	if err := rc.Control(func(fd uintptr) { inner = fn(fd) }); err != nil {
		return err
	}
	return inner
}

func ioctl(fd, req, arg uintptr) error {
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, fd, req, arg); errno != 0 {
		return errno
	}
	return nil
}
