// Package fake is the reference implementation of the adapter contract: a
// real, in-memory adapter.Driver with every optional interface, under the
// portable adapter.Sandboxes ([Adapter]), which passes the conformance
// suite in full, as an adapter and as a bare driver. Read it before
// writing a driver; use it to drive a provisioning path without a
// network.
//
// It is real in the ways that matter to a caller. Sandboxes are named and
// have incarnation ids, an in-memory filesystem that survives suspend and
// resume, an egress policy and public URLs. Commands are goroutines that
// act as processes: they read a stdin pipe, write stdout and stderr into a
// per-session journal in memory, honour SIGTERM and SIGKILL, and record an
// exit only after their last byte is journaled. Every Spawn or Attach is a
// reader goroutine that follows the journal from a cursor and delivers
// frames on a bounded channel, so replay and live follow are one read and
// attach-from-cursor is byte-exact by construction.
//
// # Command vocabulary
//
// A [adapter.Command] is either one builtin (Path "echo", Args ["hi"]) or a
// script run by "sh -c SCRIPT" (also "bash -c" and "-lc"). Scripts are
// simple commands separated by ";", "&&", "||" or newlines, with '...' and
// "..." quoting and the redirections >file, >>file, <file, >&2, 1>&2,
// 2>&1 and 2>file. There is no variable expansion. Builtins:
//
//	echo [-n] ARGS...        print ARGS
//	printf FORMAT ARGS...    %s %d %% and \n \t \\ escapes
//	cat [FILE...]            copy FILEs, or stdin until EOF
//	exit [N]                 end the script with status N
//	true, false, :           status 0, 1, 0
//	sleep SECONDS            wait (interrupted by signals)
//	tick N INTERVAL          print "tick I" N times, one per INTERVAL
//	                         (a Go duration, or seconds)
//	seq N                    print 1..N, one per line
//	probe HOST               exit 0 if the egress policy lets HOST out,
//	                         else 7 with a message on stderr
//	trap '' TERM, trap - TERM  ignore / restore SIGTERM
//	kill -SIG $$             die by signal SIG (KILL, TERM, INT, ...)
//	stty size                print "ROWS COLS" (TTY sessions only)
//	rm FILE...               remove files
//
// Anything else prints "sh: NAME: not found" on stderr and exits 127.
// Env and Dir are ignored; paths are keys in the sandbox's flat file map.
//
// # Faults
//
// [Adapter.Outage] makes every call fail with *adapter.UnavailableError
// until restored, and [Adapter.InterruptNextList] cuts the next listing:
// the conformance hooks. A sandbox destroyed under a running command ends
// its streams with adapter.ErrLost, never with an exit.
//
// # Invariants
//
// One mutex guards all state; goroutines are started only by the Adapter
// and all of them end by [Adapter.Close], which is idempotent. Output of a
// run is deterministic: the same commands and stdin give the same bytes,
// frames and exits.
package fake
