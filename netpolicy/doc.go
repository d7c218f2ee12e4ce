// Package netpolicy gives each sandbox its own network namespace and
// enforces its egress allowlist with nftables, so that a policy runnerd
// advertises is a policy the kernel enforces.
//
// A sandbox gets a namespace (bind-mounted under Config.StateDir/netns, so
// it outlives the daemon), a veth pair with a /30 from Config.Pool, and a
// default route to the host end. Enforcement lives in the host namespace,
// in the inet table Config.Table, keyed on the sandbox's veth, where a
// process inside the sandbox cannot reach it. DNS is served by a per-
// sandbox resolver on the gateway address that answers only allowlisted
// names and, for names an entry names, admits the answered addresses the
// policy's CIDRs do not already hold into the sandbox's nftables set
// before it replies, through one admission writer per Manager.
//
// Invariants:
//   - An empty allowlist denies every destination, DNS and raw IPs
//     included; the only thing a sandbox can always reach is its own
//     resolver, which then refuses every name.
//   - Fail closed: rules are installed before the veth exists; a kernel
//     error in SetPolicy leaves the sandbox denying everything; a resolver
//     that cannot admit an address answers SERVFAIL.
//   - The host is never a destination: traffic from a sandbox to any
//     address of the host (the input path) is refused whatever the
//     allowlist holds, except DNS to its own gateway; traffic to another
//     sandbox (the pool) is refused before the allowlist is read.
//   - Link-local (169.254.0.0/16: a cloud's metadata service) is never a
//     destination either: the sandbox's chain rejects it before the
//     allowlist, an entry naming it is refused, no answer admits it.
//   - A sandbox's resolver costs runnerd bounded work: a rate, a number
//     of queries in progress and of TCP connections per resolver, one
//     writer (one OS thread) for every admission, a bounded queue, at
//     most MaxAdmitted addresses per sandbox; closing a resolver cancels
//     its queries, so Teardown and Close never wait for admissions.
//   - Revocation cuts: SetPolicy deletes the conntrack entries of flows to
//     destinations it removed before it returns; the ruleset then judges
//     their next packet as new (or drops it as invalid).
//   - Dispatch costs one verdict-map lookup per packet, and Setup and
//     Teardown write only the sandbox's own objects, whatever the number
//     of sandboxes.
//   - Get-or-create: New and Setup converge existing kernel state, so a
//     restarted daemon re-adopts its sandboxes without duplicating rules,
//     and New removes the kernel objects of sandboxes without a record.
//   - Containment assumes the command is not host root: a process with
//     CAP_SYS_ADMIN in the host's user namespace can setns out.
//
// See docs/isolation.md for the design and threat model.
package netpolicy
