package oom

import (
	"fmt"
	"os"
	"testing"

	"github.com/agentrunner/runner/internal/testcap"
)

// TestKernelLogIgnoresForgedRecords: a record written to /dev/kmsg from
// user space (what a process would do to claim an OOM kill) does not
// count: only the kernel's own facility names a victim. Records logged
// before the log was opened are not read.
func TestKernelLogIgnoresForgedRecords(t *testing.T) {
	testcap.Root(t, "writing to /dev/kmsg needs root")
	w, err := os.OpenFile("/dev/kmsg", os.O_WRONLY, 0)
	if err != nil {
		testcap.Skip(t, "kmsg", fmt.Sprintf("open /dev/kmsg for writing: %v", err))
	}
	defer w.Close()
	pid := 4000000 + os.Getpid()%100000 // above pid_max: no process has it
	forged := fmt.Sprintf("<0>runner-test: Memory cgroup out of memory: Killed process %d (sh) total-vm:0kB\n", pid)
	if _, err := w.WriteString(forged); err != nil {
		t.Fatal(err)
	}
	l, err := OpenKernelLog()
	if err != nil {
		testcap.Skip(t, "kmsg", fmt.Sprintf("open /dev/kmsg: %v", err))
	}
	defer l.Close()
	if ok, err := l.KilledPID(pid); ok || err != nil {
		t.Fatalf("a record logged before the open: KilledPID = %v, %v; want false", ok, err)
	}
	for _, prefix := range []string{"", "<0>", "<3>"} {
		if _, err := w.WriteString(prefix + forged[3:]); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := l.KilledPID(pid); ok || err != nil {
		t.Fatalf("records forged from user space: KilledPID = %v, %v; want false", ok, err)
	}
}
