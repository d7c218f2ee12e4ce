// Command writer is the command of the follow-latency figure: after one
// line on stdin it writes COUNT lines, each the CLOCK_MONOTONIC time in
// nanoseconds (23 digits and a newline) taken just before its write(2),
// pausing INTERVAL before each so the reader is blocked when it lands.
//
//	writer COUNT INTERVAL
package main

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: writer COUNT INTERVAL")
		os.Exit(2)
	}
	count, err := strconv.Atoi(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "writer:", err)
		os.Exit(2)
	}
	interval, err := time.ParseDuration(os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, "writer:", err)
		os.Exit(2)
	}
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		fmt.Fprintln(os.Stderr, "writer: wait for go:", err)
		os.Exit(1)
	}
	line := make([]byte, 0, 24)
	for range count {
		time.Sleep(interval)
		var ts unix.Timespec
		unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
		line = fmt.Appendf(line[:0], "%023d\n", ts.Nano())
		if _, err := os.Stdout.Write(line); err != nil {
			os.Exit(1)
		}
	}
}
