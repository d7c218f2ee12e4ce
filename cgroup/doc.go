// Package cgroup gives each sandbox its own control group, so one sandbox's
// commands cannot take the memory, PIDs or CPU of runnerd, the shims or
// another sandbox, and so an OOM kill is read from the kernel instead of
// guessed from a signal.
//
// Layout, in every hierarchy the [Manager] uses (one unified hierarchy
// under cgroup v2; memory, pids, cpu, cpuacct and, when mounted, freezer
// under v1 or the hybrid layout):
//
//	<root>/<sandbox>            the sandbox's limits; holds no process itself
//	<root>/<sandbox>/<session>  one leaf per session; the shim places the
//	                            command here (sessiondir.Spec.Cgroups) before exec
//
// A leaf per session keeps v2's no-internal-processes rule (a cgroup with
// controllers enabled for its children holds no process) and attributes OOM
// kills: a leaf's memory events count only the kills of that session's
// processes, while the limit that triggered them is the sandbox's.
//
// Invariants:
//
//   - Advertise or refuse: [Manager.Available] is nil only where memory,
//     pids and cpu limits can be written; anywhere else a non-zero [Limits]
//     is refused with [ErrNotSupported], never accepted unenforced.
//   - Bad limits are [ErrInvalid] (the daemon answers 400 invalid); names
//     that are not a single path element are [ErrInvalid] too, so a hostile
//     name cannot reach outside root.
//   - Root is the caller's or untouched: a Root that already exists but
//     belongs to another uid, or is not writable by the caller, is another
//     runnerd's (two started from one login share a cgroup, so the
//     default relative Root); New then returns a Manager whose every
//     method, List included, fails with Available's error.
//   - Nothing is removed implicitly: New creates root if missing and never
//     deletes a sandbox's cgroup, so a restarted runnerd finds every
//     sandbox (and its limits) where it left them ([Manager.List]).
//   - [Manager.Remove] leaves no process behind: whatever still runs in
//     the sandbox is killed (v2 cgroup.kill; v1 SIGKILL of every listed
//     pid, through a pidfd and only once the pinned process is confirmed
//     inside, until none is left) before the directories are removed.
//   - The shims are never in a sandbox cgroup: they must outlive an OOM
//     kill of their command to report it.
//
// [OOMKills] reads the kill counters from plain files. It lives in the
// standard-library-only subpackage oom (as oom.Kills) so that the shim,
// which needs only that at its command's exit, does not link containerd's
// library (about 7.5 MB).
//
// A Manager is safe for concurrent use. Operations on the same sandbox
// name are not ordered against each other (an Ensure racing a Remove may
// leave either outcome): the daemon serialises them per sandbox.
//
// docs/cgroups.md says where the cgroups live under v1 and v2, what a
// restart of runnerd does to them (nothing), and how each was tested.
package cgroup
