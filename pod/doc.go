// Package pod makes a sandbox a place: a holder process that owns a user,
// mount, pid, ipc, uts and cgroup namespace (and sits in the sandbox's
// network namespace), built once, which every session then joins
// (docs/isolation.md, "The pod").
//
// Create starts the holder (the shim program's `pod` mode, HolderMain)
// with Go's SysProcAttr: clone(NEWUSER|NEWNS|NEWPID|NEWIPC|NEWUTS) with
// uid and gid 0..65535 mapped to a subordinate range given by the caller,
// from a thread inside the caller's network namespace and (cgroup v2)
// cloned straight into the sandbox's cgroup. The holder is uid 0 of its
// user namespace, pid 1 of its pid namespace: it builds the pod's root
// once (an overlay whose lower layers are the host's system directories,
// read-only, idmapped and, but for the host's code, masked so that what
// the host keeps from everybody but its root is absent; or an
// operator-named root file system; and whose upper layer is the caller's
// directory), binds the operator's paths and the resolver file into it
// (read-only flags locked by the kernel), pivots into it, says ready, and
// from then on only reaps orphans. Root inside can install packages
// (apt-get, dpkg): what it changes lands in the upper layer. It holds no descriptor of the host's once ready
// and has no capability outside its user namespace.
//
// The caller (runnerd) is the holder's parent and reaps it in Destroy;
// after a restart Adopt finds it again by pid and start time, and Destroy
// waits for it through its pidfd. Nothing is mounted in the caller's
// mount namespace: every mount of the pod lives in the holder's, and goes
// with it.
//
// Subordinate ranges (Ranges) carve an operator's --subid-range into the
// 65,536-id blocks one pod maps.
package pod
