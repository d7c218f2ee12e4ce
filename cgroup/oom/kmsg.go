package oom

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"syscall"
)

// KernelLog reads the kernel's log (/dev/kmsg) from the moment it was
// opened, to tell which process an OOM kill chose: the memory cgroup's
// counter says that a kill happened in the cgroup, never whom it killed,
// and a session's command shares its cgroup with everything it starts.
// The OOM killer logs its victim by pid ("Memory cgroup out of memory:
// Killed process 1234 (sh) ..."), in the initial pid namespace.
//
// A KernelLog is used by one goroutine at a time; Close releases it.
type KernelLog struct {
	f   *os.File
	buf []byte
}

// OpenKernelLog opens /dev/kmsg positioned at its end, so only records
// logged from now on are read. It fails where the log is not readable
// (no /dev/kmsg in a container, dmesg_restrict for a non-root reader):
// a kill cannot be attributed there.
func OpenKernelLog() (*KernelLog, error) {
	return openKernelLog("/dev/kmsg")
}

func openKernelLog(path string) (*KernelLog, error) {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	if _, err := syscall.Seek(fd, 0, io.SeekEnd); err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("seek %s: %w", path, err)
	}
	return &KernelLog{f: os.NewFile(uintptr(fd), path), buf: make([]byte, 8192)}, nil
}

// Close releases the log. Idempotent.
func (l *KernelLog) Close() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

// KilledPID reads the records logged since the last call (without
// waiting) and reports whether one says the OOM killer killed pid.
func (l *KernelLog) KilledPID(pid int) (bool, error) {
	want := []byte("Killed process " + strconv.Itoa(pid) + " (")
	found := false
	for {
		// One record per read; the fd is non-blocking, so the end of
		// what is logged is EAGAIN.
		n, err := syscall.Read(int(l.f.Fd()), l.buf)
		switch {
		case errors.Is(err, syscall.EAGAIN):
			return found, nil
		case errors.Is(err, syscall.EPIPE):
			continue // records overwritten before they were read: go on with the next
		case errors.Is(err, syscall.EINTR):
			continue
		case err != nil:
			return found, fmt.Errorf("read kernel log: %w", err)
		case n == 0:
			return found, nil
		}
		// "prio,seq,usec,flags;message\n KEY=VALUE\n..."; prio is
		// facility<<3 | level, and only the kernel logs with facility 0:
		// a record written to /dev/kmsg from user space never has it, so
		// a process cannot forge the OOM killer's word.
		rec := l.buf[:n]
		prio, _, _ := bytes.Cut(rec, []byte{','})
		if p, err := strconv.Atoi(string(prio)); err != nil || p>>3 != 0 {
			continue
		}
		if i := bytes.IndexByte(rec, ';'); i >= 0 {
			msg, _, _ := bytes.Cut(rec[i+1:], []byte{'\n'})
			if bytes.Contains(msg, want) && bytes.Contains(msg, []byte("out of memory")) {
				found = true
			}
		}
	}
}
