// Package shim is the per-session supervisor: one small process per
// session that owns a running command, tees every output byte into the
// session's journal, serves a control socket (stdin, close-stdin, resize,
// signal, terminate, status), and records the command's true exit.
//
// The same code runs as runnerd's hidden `shim` subcommand and as the
// standalone `runner-shim serve`; both call [Main], whose first argument
// names a mode of its table, with their [Hooks] (what a program adds to
// a session's life: runner-shim's Sprites task hold). Only those programs
// import this package. The other roles live beside it, as containerd
// cuts its shim: shim/launch starts shims (launch.Pool: warm or cold, the
// one way) and talks to them (launch.DialFor), shim/sessiondir reads a
// session directory without its shim (status, exit record, frames,
// info), and shim/internal/proto is the control and readiness protocol
// both ends speak.
//
// Invariants:
//
//   - Detached: the shim runs in its own session (setsid), reparented to
//     init or the nearest subreaper (it is started through a short-lived
//     intermediate process, a warm shim too), so a kill -9 of whoever
//     launched it never touches the command.
//   - Spawn-ack: launch.Pool.Start and launch.Prepared.Start return only once the command's
//     execve succeeded (the shim reports "ready PID SHIMPID STARTED" on an
//     inherited pipe, or a warm shim's socket, after exec.Cmd.Start
//     returned or the nsexec helper reported its execve), or with the
//     start error (an errno such as ENOENT survives the process boundary).
//     The control socket and the journal exist before the command runs.
//   - One path for output: child → shim → journal segment files → readers.
//     Readers read files, never the shim, so a slow reader never blocks the
//     command. When the journal cannot be written (disk full) the shim
//     stops reading and retries: the command is backpressured and no byte
//     is dropped; Status reports WriteError meanwhile.
//   - Exit order (conmon's): the child exits → its status is taken →
//     output is drained to EOF (bounded by DrainGrace, see below) → the
//     journal is synced and its exit record published → only then are
//     Terminate and status waiters answered → the shim lingers while any
//     descendant lives (below) → the shim removes ctl.sock and exits.
//     A journal that cannot be finished (disk full) is retried until it
//     can, unless the session directory itself is gone (its state deleted
//     under the shim): no reader can see a record then, so the shim
//     writes it to its stderr and goes on to exit.
//   - Nothing escapes: the shim is a child subreaper, set before the
//     command starts, so every process the session starts stays below it
//     (an orphan is reparented to the shim, not init). The shim owns every
//     wait (one wait4(-1) loop, reaper.go): the command's status is
//     recorded, every other child is reaped at once (no zombies). After
//     the exit record the shim stays alive while any process below it
//     lives, serving the control socket; Status.Descendants counts them.
//     Terminate stops them all: SIGTERM to the command's group and to the
//     group of every process below the shim, SIGKILL after the grace to
//     every one still alive, rescanning until none is left; on an ended
//     session it does the same to the lingering ones. Only a kill -9 of
//     the shim itself lets them go to init (the session is then lost).
//   - Exit truth: a normal exit records reason "exited" and its code; a
//     death by signal records reason "signaled", the signal number and
//     Code 128+signal. Never 0, never -1. A command that ended after a
//     Terminate asked it to stop has Terminated set besides. A shim that
//     dies without the record leaves the session "lost", never exited.
//   - Stdin never blocks control: a stdin write that the child does not
//     read holds only the stdin path; resize, signal, terminate and status
//     are served concurrently.
//   - One exec path (exec.go): execCommand alone decides how a command
//     starts and reaches its execve (Go's fork/exec directly, else the
//     nsexec helper's one execve, the helper forked for the start or
//     started ahead); every step between the shim's fork and the
//     command's first instruction (cgroup placement, namespaces, the
//     capability bounding set, setgroups/setgid/setuid, ambient and
//     inheritable capabilities, no_new_privs, chdir) is listed once, in
//     one order, and done at the fork or in the nsexec helper; an
//     ordinary session (no Cgroups v1, ResolvConf, Binds or Isolate) takes the
//     direct path. The shim itself is never in a command's cgroups.
//   - Isolate: a command of an Isolate spec runs as a user that is not
//     root, with no_new_privs, empty ambient and inheritable sets and a
//     bounding set of CAP_NET_RAW alone (so a binary with that file
//     capability, ping, can exec; no_new_privs keeps it from gaining it),
//     so no setuid binary or file capability lifts it back up.
//   - Pod: a command of a Pod spec starts inside the pod's namespaces,
//     joined by the helper's C constructor before its Go runtime
//     (package podjoin, pod.go), as the pod's user, still the shim's
//     child; nothing is made per spawn. Without cgo it is refused, never
//     started outside the pod. The shim's pod mode is the pod's holder
//     (package pod).
//
// Files, by role: main.go is the process's entry (Main and its table of
// modes, warm shims, detach), hooks.go what the program adds; server.go
// the per-session server type, stage.go its staging (prepare, moveTo,
// adopt, undo), supervise.go its supervision (start, run, pump, finish),
// control.go its control socket; exec.go (and execsteps.go, its steps), nsexec.go and proc.go the exec
// path, pod.go its path into a pod, filter.go the seccomp program it
// carries; trace.go the start's spans (RUNNER_SHIM_TRACE); reaper.go the
// subreaper.
//
// Drain window: after the child exits, the shim keeps reading until every
// output stream reaches EOF (pipe EOF, or EIO on the PTY master once every
// holder of the slave closed it). A grandchild that keeps the pipe or the
// terminal open (a backgrounded server) would hold the session open
// forever, so reading stops DrainGrace (2 s) after the child's exit, with a
// final non-blocking sweep of whatever is already buffered. The shim does
// not kill such leftovers on its own (it keeps them, lingering, until
// Terminate); once it has closed its read ends their writes fail with
// EPIPE (pipes) or they see a hangup (PTY).
package shim
