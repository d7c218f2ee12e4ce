package sandboxes

// Identities and isolation: who a sandbox's commands run as, and the
// permissions of runnerd's state that keep them out of it.
//
// When runnerd runs as root, every sandbox is isolated by default
// (--isolate all); under --isolate none only a contained one (with a
// network policy) is. An isolated sandbox runs its commands with
// sessiondir.Spec.Isolate (no_new_privs, empty ambient and inheritable sets, a
// bounding set of CAP_NET_RAW alone) as an unprivileged user: the one it names, or else a
// uid/gid of its own that the registry allocates with its record
// (registry.Identity) from Config.IdentityFirst..IdentityLast and frees
// with it. Its workspace belongs to that identity, mode 0700. Where
// network policies are enforced, an isolated sandbox created without one
// gets a network namespace of its own anyway, with open egress
// (openEgress): every name resolves and every address outside the host
// and the pool is reachable, the host never is. Root is never the user of
// an isolated sandbox: a create naming it, or a policy added to a sandbox
// whose commands run as root, is refused (invalid), because root, even
// without capabilities, owns root's files, and with them leaves any
// namespace.
//
// Where runnerd is not root there are no identities: it cannot switch
// users, and a contained sandbox cannot exist (netpolicy needs root);
// --isolate all is refused at start, and the start log says what is not
// isolated.

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"

	"github.com/agentrunner/runner/daemon/apierr"
	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/netpolicy"
	"github.com/agentrunner/runner/pod"
	"github.com/agentrunner/runner/shim/sessiondir"
	"github.com/agentrunner/runner/wire"
)

// identities is the isolation policy of one runnerd, fixed at start.
type identities struct {
	enabled bool // runnerd is root: isolated sandboxes get an identity
	all     bool // --isolate all
	pool    registry.IdentityPool
}

// CheckIdentityRange refuses a range holding an id Linux gives a meaning:
// root, nobody, and the 16- and 32-bit (uid_t)-1.
func CheckIdentityRange(first, last uint32) error {
	if last < first {
		return fmt.Errorf("config: identity range %d-%d is empty", first, last)
	}
	for _, id := range []uint32{0, 65534, 65535, 1<<32 - 1} {
		if first <= id && id <= last {
			return fmt.Errorf("config: identity range %d-%d holds the special id %d", first, last, id)
		}
	}
	return nil
}

// InitIdentities fixes the isolation policy from cfg and runnerd's euid,
// and tightens the state directory's modes (tightenState).
func (s *Manager) InitIdentities() error {
	if err := tightenState(s.cfg.StateDir); err != nil {
		return err
	}
	root := os.Geteuid() == 0
	if s.cfg.IsolateAll && !root {
		return errors.New("config: --isolate all needs runnerd to run as root (each sandbox runs as its own uid)")
	}
	if shared := sharedTmps(s.cfg.StateDir); root && len(shared) > 0 {
		s.log.Warn("the state directory lies under a directory isolated sandboxes would get a private copy of; that one stays shared with the host (its files are visible to every sandbox)", "shared", shared, "state", s.cfg.StateDir)
	}
	switch {
	case !root:
		s.log.Warn("runnerd is not root: sandboxes are not isolated from each other or from runnerd's user: they run as runnerd's uid, read its state and token, and see and signal its processes; network policies are refused (they need root). Run runnerd as root for isolation, or inside a VM that is the boundary")
	case !s.cfg.IsolateAll:
		s.log.Warn("--isolate none: a sandbox without a network policy runs as root (or its user) on the host network: it can read runnerd's token and state, see and signal every process, and write the host. Only for a VM that is itself the boundary")
	}
	s.ids = identities{
		enabled: root,
		all:     s.cfg.IsolateAll,
		pool:    registry.IdentityPool{First: s.cfg.IdentityFirst, Last: s.cfg.IdentityLast, Taken: hostUsesID},
	}
	if s.cfg.Pods {
		if !root {
			return errors.New("config: --isolate pod needs runnerd to run as root (it maps each pod to ids of its own)")
		}
		// A pod maps a block; its first id is the record's identity.
		s.ids.pool.Step = pod.BlockSize
		if uint64(s.cfg.IdentityLast)-uint64(s.cfg.IdentityFirst)+1 < pod.BlockSize {
			return fmt.Errorf("config: --isolate pod: identity range %d-%d holds no block of %d ids", s.cfg.IdentityFirst, s.cfg.IdentityLast, pod.BlockSize)
		}
		s.log.Info("sandboxes are pods", "subid_first", s.cfg.IdentityFirst, "subid_last", s.cfg.IdentityLast,
			"pods", (uint64(s.cfg.IdentityLast)-uint64(s.cfg.IdentityFirst)+1)/pod.BlockSize)
	}
	if root && !s.cfg.Pods {
		// An isolated command starts in its workspace whatever the
		// directories above it allow (the shim opens it as root before the
		// user switch), but reaches it by its absolute path only if every
		// one lets others pass. Say so now.
		for d := filepath.Dir(s.cfg.StateDir); ; d = filepath.Dir(d) {
			if fi, err := os.Stat(d); err == nil && fi.Mode().Perm()&0o001 == 0 {
				s.log.Warn("a directory above the state directory is not passable by other users (chmod o+x): isolated sandboxes start in their workspaces but cannot reach them by absolute path", "dir", d)
				break
			}
			if d == filepath.Dir(d) {
				break
			}
		}
	}
	return nil
}

// hostUsesID reports whether id is a user or group of the host (NSS).
func hostUsesID(id uint32) bool {
	n := strconv.FormatUint(uint64(id), 10)
	if _, err := user.LookupId(n); err == nil {
		return true
	}
	_, err := user.LookupGroupId(n)
	return err == nil
}

// openEgress is the network of an isolated sandbox created without a
// policy: its own namespace, open egress (netpolicy.OpenEgress), without
// the private networks unless --egress-private allow
// (netpolicy.PublicEgress).
func (s *Manager) openEgress() *wire.Network {
	if s.cfg.EgressPrivate {
		return &wire.Network{Allow: netpolicy.OpenEgress().Allow}
	}
	return &wire.Network{Allow: netpolicy.PublicEgress().Allow}
}

// Isolating says whether a sandbox created now, contained or not, is
// isolated.
func (s *Manager) Isolating(contained bool) bool {
	return s.ids.enabled && (contained || s.ids.all)
}

// isolated says whether sb's commands run isolated: it was made so, or
// this runnerd isolates what it is.
func (s *Manager) Isolated(sb registry.Sandbox) bool {
	return sb.Isolated || sb.Identity != nil || s.Isolating(sb.Network != nil)
}

// errRootContained is the refusal of root as the user of an isolated
// sandbox, saying how to get one.
func errRootContained(what string) error {
	return apierr.Invalid("%s: its commands would run as root, who can leave any namespace and read runnerd's state, so it cannot be contained; "+
		"for a contained sandbox omit user (runnerd runs it as a uid of its own) or name an unprivileged user", what)
}

// identityFor validates the run-as user of a sandbox being created and
// says how it is isolated: pool is where its identity comes from (nil:
// none, it runs as user or is not isolated). uid and gid are user's, or
// -1 when user is empty.
func (s *Manager) identityFor(name, userName string, uid, gid int, contained bool) (pool *registry.IdentityPool, isolated bool, err error) {
	if !s.Isolating(contained) {
		return nil, false, nil
	}
	if userName == "" {
		p := s.ids.pool
		return &p, true, nil
	}
	if uid == 0 || gid == 0 {
		return nil, false, errRootContained(fmt.Sprintf("sandbox %q: user %q is uid %d gid %d", name, userName, uid, gid))
	}
	return nil, true, nil
}

// ownWorkspace gives sb's workspace to its identity, 0700. It runs on
// every create, so a create retried after a crash between the record's
// commit and the chown repairs it.
func (s *Manager) ownWorkspace(sb registry.Sandbox) error {
	if sb.Identity == nil {
		return nil
	}
	uid, gid := sb.Identity.UID, sb.Identity.GID
	if InPod(sb) {
		// Its user inside, mapped: the block's first id is root inside.
		u, err := podUser(sb.User)
		if err != nil {
			return err
		}
		in, ig, _ := sessiondir.PodUser(u)
		uid, gid = uid+in, gid+ig
	}
	if err := os.Lchown(sb.Workspace, int(uid), int(gid)); err != nil {
		return apierr.Unavailable("give workspace to uid %d: %v", uid, err)
	}
	if err := os.Chmod(sb.Workspace, 0o700); err != nil {
		return apierr.Unavailable("chmod workspace: %v", err)
	}
	return nil
}

// IsolateSpec makes spec run as sb's identity with sessiondir.Spec.Isolate when
// sb is isolated. A sandbox that is isolated but has no unprivileged user
// (recorded before identities existed, or before --isolate all) is
// refused rather than run as root.
func (s *Manager) IsolateSpec(sb registry.Sandbox, spec *sessiondir.Spec) error {
	if !s.Isolated(sb) {
		return nil
	}
	if sb.Identity != nil {
		spec.User = fmt.Sprintf("%d:%d", sb.Identity.UID, sb.Identity.GID)
	}
	if spec.User == "" {
		return errRootContained(fmt.Sprintf("sandbox %q is isolated but has no identity (it was created before runnerd gave identities); destroy and create it again", sb.Name))
	}
	spec.Isolate = true
	return nil
}

// checkContainable refuses a network policy on a sandbox whose commands
// run as root (PUT .../network): the policy would contain them in name
// only.
func (s *Manager) checkContainable(sb registry.Sandbox) error {
	if !s.ids.enabled || sb.Identity != nil {
		return nil
	}
	if sb.User == "" {
		// Not errRootContained: its advice (omit user) is what this
		// sandbox's creator already did.
		return apierr.Invalid("sandbox %q was created without a network policy, so its commands run as runnerd's own user (root), "+
			"who can leave any namespace; a policy cannot contain it afterwards: destroy it and create it with its policy "+
			"(network in the create; runner create %s --allow HOST or --deny-all), and runnerd gives it a uid of its own", sb.Name, sb.Name)
	}
	u, err := user.Lookup(sb.User)
	if err != nil {
		return apierr.Invalid("sandbox %q: user %q: %v", sb.Name, sb.User, err)
	}
	if u.Uid == "0" || u.Gid == "0" {
		return errRootContained(fmt.Sprintf("sandbox %q: user %q is uid %s gid %s", sb.Name, sb.User, u.Uid, u.Gid))
	}
	return nil
}

// tightenState sets the modes that keep a sandbox's command out of
// runnerd's state, whatever an older runnerd or an operator left: STATE
// and STATE/sandboxes 0711 (a sandbox user may pass through to its own
// workspace, but list neither), STATE/s 0700 (session directories:
// journals, spec.json, control sockets), the token and registry 0600.
// The unix socket is made 0600 where it is created (listenUnix).
func tightenState(state string) error {
	for _, f := range []struct {
		path string
		mode os.FileMode
	}{
		{state, 0o711},
		{filepath.Join(state, "sandboxes"), 0o711},
		{filepath.Join(state, "s"), 0o700},
		{filepath.Join(state, "token"), 0o600},
		{filepath.Join(state, "registry.db"), 0o600},
	} {
		if err := os.Chmod(f.path, f.mode); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("chmod %s: %w", f.path, err)
		}
	}
	return nil
}
