// Package sandboxes is runnerd's sandboxes manager: it owns a sandbox's
// lifecycle (create, get, list, suspend, resume, destroy), who its
// commands run as (identities, isolation), its private directories
// (/tmp, /var/tmp, /dev/shm) and passwd files, its cgroup and limits,
// its disk (a volume of the storage pool, with its disk budget),
// its network namespace and policy, its checkpoints, and the background
// adoption of cgroups and networks when runnerd starts.
//
// Invariants:
//
//   - The registry (daemon/registry) is the source of truth below the
//     manager: not_found is answered only when it definitively has no
//     such record, and a record is written before the kernel is touched
//     so a failure leaves a sandbox contained more than asked, never less.
//   - Every change of a sandbox holds that sandbox's lock (Locks), which
//     the session side holds too while it spawns: a spawn never races a
//     destroy or a suspend.
//   - A failed create leaves nothing (undo.go); a destroy removes the
//     record last, so a crash leaves a sandbox to destroy again, never
//     files without a record.
//   - Methods take a context and typed arguments and return typed results
//     and *apierr.Error; none sees an HTTP request. What the manager needs
//     of sessions (stopping them, their directories, whether one runs)
//     it asks through Sessions, so package daemon's session side imports
//     this package and never the reverse.
//   - Capabilities are advertised only when delivered: NetPolicy and
//     Cgroups are nil where the host cannot enforce them, and requests
//     that need them answer not_supported.
//
// Layout: manager.go (Manager, Config, the Sessions seam), lookup.go
// (names, incarnations, registry answers), sandboxlife.go (create,
// suspend, resume, destroy) and undo.go (a failed create undone),
// identity.go (identities and isolation), privatetmp.go and
// passwdfiles.go (what an isolated command's mount namespace binds),
// limits.go (cgroups, limits, the leaf sweep), disk.go (the storage
// pool: a volume per sandbox, disk budgets), network.go (netpolicy),
// checkpoints.go (checkpoint, list, restore).
package sandboxes
