// Package podjoin joins a pod before the Go runtime starts: setns(2) into
// a user namespace needs a single-threaded process, and a Go process is
// never one once its runtime runs. Imported (for its side effect) only
// by the shim, whose nsexec helper it turns into a session's first
// process inside a pod (shim/pod.go).
//
// With cgo, a C constructor (podjoin.c) runs before the runtime in every
// process of the binary and returns at once unless the environment holds
// EnvVar, which only the shim sets, for its helper. Then, still single
// threaded, it:
//
//  1. writes "0" to each inherited cgroup v1 tasks descriptor (the
//     session's leaf directories, opened by the shim): the one thread
//     moves, before it joins the pod's cgroup namespace;
//  2. setns(pidfd, NEWUSER|NEWNS|NEWPID|NEWIPC|NEWUTS|NEWCGROUP|NEWNET)
//     with the holder's pidfd (Linux 5.8): all seven at once, so no
//     window in which some are the host's;
//  3. setgroups(0), setresgid, setresuid to the session's ids inside
//     (without them, the host's root is unmapped there: the overflow
//     uid);
//  4. forks with CLONE_PARENT, so the child, pid 2 or more of the pod's
//     pid namespace, is the shim's child, not its own (the shim's wait4
//     has its exit code and signal, as for any command);
//  5. the parent writes "pod PID\n" (the child's pid as the shim sees
//     it) on the report descriptor and exits 0; the child waits for
//     that line to be written, then returns from the constructor into
//     the Go runtime, which runs the helper's remaining steps (shim
//     nsexec.go: the session, the filter, the execve).
//
// A failure is reported as the helper reports one ("error ERRNO setup
// STEP\n") and the process exits 127. Without cgo (images/* build the
// hosted guests' binaries so, and those never start pods) Supported is
// false and the shim refuses a pod start with an error: never a command
// started outside the pod it was meant for.
//
// Written for this project after reading how runc's libcontainer/nsenter
// does the same (a constructor that joins namespaces and forks before
// the runtime); none of its code is used.
package podjoin

// EnvVar carries the join's parameters to the constructor:
// "PIDFD,UID,GID,REPORTFD[,TASKSFD...]" (descriptor numbers as the helper
// inherits them). The constructor removes it from the environment.
const EnvVar = "_RUNNER_PODJOIN"
