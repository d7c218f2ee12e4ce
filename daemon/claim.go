package daemon

// Several runnerds on one host. Each runnerd owns a uid range (the
// identities of its isolated sandboxes) and a cgroup root (its
// sandboxes' cgroups); two that share either can signal each other's
// processes, read each other's workspaces, or adopt and remove each
// other's cgroups. So runnerd claims both at start and refuses to start,
// naming the other daemon, when a live runnerd holds an overlapping range
// or the same cgroup root.
//
// The claims are files in Config.ClaimDir (default /run/runnerd/claims: a
// tmpfs, gone at reboot with the processes they describe), one per state
// directory, named by a hash of its path, holding the owner's state
// directory, pid, identity range and cgroup root as JSON. The owner holds
// an exclusive flock on its file for as long as it runs, so a claim is
// live exactly while its owner lives: the kernel drops the lock when the
// process dies, however it dies, and a stale file is ignored (and
// replaced). The check of the others and the write of one's own happen
// under an exclusive flock of ClaimDir/.lock, so two runnerds starting at
// once cannot both pass.
//
// The default identity range is per state directory, not one range for
// every runnerd: the 4,094 ranges of 65,536 ids in the part of the uid
// space systemd documents as unused (0x70000000-0x7FFDFFFF) are slots,
// and a state directory starts at the slot its path hashes to and takes
// the first one no live runnerd holds. The choice is saved in
// STATE/identity-range and kept across restarts (the registry's
// identities were allocated from it); a state directory whose registry
// already holds identities and has no saved choice keeps the range
// older versions used for every runnerd (slot 0, 0x70000000-0x7000FFFF).
// An explicit --identity-range is used as given, and refused on overlap.
//
// With network policy on, the claim holds the netpolicy state directory,
// the address pool and the nftables table too, each with the network
// namespace it lives in (the host's, or --netpolicy-host-netns): two
// runnerds that share a state directory adopt and tear down each other's
// sandboxes, two whose pools overlap in one namespace hand out the same
// addresses and masquerade each other's traffic, and two that share a
// table rewrite each other's base chains and remove each other's
// dispatch elements (every sandbox of the other loses egress and DNS).
// The table is runnerd's own: netpolicy.TablePrefix and 4 hex digits
// from the state directory's hash (the next free value when a live
// runnerd in the namespace holds it), saved in NETSTATE/table and kept
// across restarts; a netpolicy state directory that already holds
// sandboxes and no saved name keeps netpolicy.DefaultTable, the table
// every runnerd shared before (its sandboxes' rules are there).

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentrunner/runner/cgroup"
	"github.com/agentrunner/runner/daemon/sandboxes"
	"github.com/agentrunner/runner/internal/atomicfile"
	"github.com/agentrunner/runner/netpolicy"
)

// DefaultClaimDir is Config.ClaimDir's default.
const DefaultClaimDir = "/run/runnerd/claims"

// Identity range slots (see the file comment).
const (
	identitySlotSize  = 1 << 16
	identitySlotFirst = DefaultIdentityFirst // slot 0: the range every runnerd used before
	identitySlots     = (0x7FFE0000 - identitySlotFirst) / identitySlotSize
)

// identityRangeFile is where a derived identity range is saved.
const identityRangeFile = "identity-range"

// Under --isolate pod the identity range is the pods' subordinate range:
// a slot of podSlotBlocks blocks of 65,536 ids (a pod maps one block),
// in the same unused part of the uid space, saved in subidRangeFile (a
// state directory that ran uid identities keeps its identity-range file
// for them). 256 pods a runnerd; 15 such slots a host.
const (
	podSlotBlocks  = 256
	podSlotSize    = podSlotBlocks * identitySlotSize
	podSlots       = (0x7FFE0000 - identitySlotFirst) / podSlotSize
	subidRangeFile = "subid-range"
)

// claim is the content of a claim file.
type claim struct {
	StateDir      string `json:"state_dir"`
	PID           int    `json:"pid"`
	IdentityFirst uint32 `json:"identity_first"`
	IdentityLast  uint32 `json:"identity_last"`
	// CgroupRoot is the cgroup root as a path from the hierarchy's root
	// (relative roots resolved against runnerd's own cgroup); "" with
	// cgroups off.
	CgroupRoot string `json:"cgroup_root,omitempty"`
	// CgroupRoots is the cgroup root in every hierarchy a sandbox lives
	// in, as "controller:path" ("":path for v2's unified one). Under v1 a
	// relative root nests under runnerd's own cgroup separately in each
	// hierarchy, so two runnerds in different memory cgroups but the same
	// pids, cpu or freezer cgroup share those trees: sandboxes of the
	// same name then share session cgroups, and one runnerd's removal of
	// its session's cgroup SIGKILLs the other's command. CgroupRoot alone
	// (the memory hierarchy's) missed that.
	CgroupRoots []string `json:"cgroup_roots,omitempty"`
	// NetState, NetNS, Pool and Table are the netpolicy state directory,
	// the network namespace the rules live in (as "dev:inode" of its
	// nsfs file), the address pool and the nftables table; empty with
	// network policy off.
	NetState string `json:"net_state,omitempty"`
	NetNS    string `json:"net_ns,omitempty"`
	Pool     string `json:"pool,omitempty"`
	Table    string `json:"table,omitempty"`
}

func (c claim) String() string {
	return fmt.Sprintf("runnerd pid %d (state directory %s)", c.PID, c.StateDir)
}

// errClaimed is returned (wrapped) when another live runnerd holds what
// this one would claim.
var errClaimed = errors.New("claimed by another runnerd")

// hostClaim is this runnerd's claim, held until release.
type hostClaim struct {
	f    *os.File
	path string
}

// release gives the claim up (the file goes; the lock with it).
func (h *hostClaim) release() {
	if h == nil {
		return
	}
	os.Remove(h.path)
	h.f.Close()
}

// claimHost fills cfg's identity range when it is unset (see the file
// comment), then claims it and the cgroup root in cfg.ClaimDir, failing
// with errClaimed naming the other runnerd on an overlap. hasIdentities
// says whether the registry already holds identities (for the legacy
// default). The caller releases the claim when it stops.
func claimHost(cfg *Config, hasIdentities bool) (*hostClaim, error) {
	dir := cfg.ClaimDir
	if dir == "" {
		dir = DefaultClaimDir
		if os.Geteuid() != 0 {
			// /run/runnerd is root's; an unprivileged runnerd's claims
			// (cgroup roots of a delegated subtree) are its user's.
			dir = filepath.Join(os.TempDir(), fmt.Sprintf("runnerd-%d", os.Geteuid()), "claims")
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("claim identity range and cgroup root: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("claim identity range and cgroup root: %w", err)
	}
	defer lock.Close() // drops the flock
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return nil, fmt.Errorf("lock %s: %w", lock.Name(), err)
	}
	sum := sha256.Sum256([]byte(cfg.StateDir))
	mine := filepath.Join(dir, hex.EncodeToString(sum[:8])+".json")
	others, resting, err := liveClaims(dir, mine)
	if err != nil {
		return nil, err
	}
	if cfg.IdentityFirst == 0 && cfg.IdentityLast == 0 {
		if err := defaultIdentityRange(cfg, sum, hasIdentities, others, resting); err != nil {
			return nil, err
		}
	}
	c := claim{StateDir: cfg.StateDir, PID: os.Getpid(), IdentityFirst: cfg.IdentityFirst, IdentityLast: cfg.IdentityLast}
	if cfg.Cgroups != CgroupsOff {
		if c.CgroupRoot, err = resolveCgroupRoot(cfg.CgroupRoot); err != nil {
			return nil, err
		}
		if c.CgroupRoots, err = resolveCgroupRoots(cfg.CgroupRoot); err != nil {
			return nil, err
		}
	}
	if cfg.NetPolicy != NetPolicyOff {
		if err := claimNet(cfg, &c, sum, others); err != nil {
			return nil, err
		}
	}
	for _, o := range others {
		if o.IdentityFirst <= c.IdentityLast && c.IdentityFirst <= o.IdentityLast {
			return nil, fmt.Errorf("identity range %d-%d overlaps %d-%d of %s: give each runnerd its own --identity-range: %w",
				c.IdentityFirst, c.IdentityLast, o.IdentityFirst, o.IdentityLast, o, errClaimed)
		}
		if c.CgroupRoot != "" && c.CgroupRoot == o.CgroupRoot {
			return nil, fmt.Errorf("cgroup root %s is used by %s: give each runnerd its own --cgroup-root: %w", c.CgroupRoot, o, errClaimed)
		}
		if shared := sharedRoot(c.CgroupRoots, o.CgroupRoots); shared != "" {
			return nil, fmt.Errorf("cgroup root %s is used by %s: give each runnerd its own --cgroup-root: %w", shared, o, errClaimed)
		}
	}
	f, err := os.OpenFile(mine, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("claim identity range and cgroup root: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("state directory %s is used by another runnerd: %w", cfg.StateDir, errClaimed)
		}
		return nil, fmt.Errorf("lock %s: %w", mine, err)
	}
	b, _ := json.Marshal(c)
	if err := f.Truncate(0); err == nil {
		_, err = f.WriteAt(append(b, '\n'), 0)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("write claim %s: %w", mine, err)
	}
	return &hostClaim{f: f, path: mine}, nil
}

// liveClaims returns the claims in dir whose owner still holds its lock,
// other than the file mine.
func liveClaims(dir, mine string) (live, resting []claim, err error) {
	names, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, nil, err
	}
	for _, n := range names {
		if n == mine {
			continue
		}
		f, err := os.Open(n)
		if err != nil {
			continue // removed by its owner meanwhile
		}
		var c claim
		derr := json.NewDecoder(f).Decode(&c)
		if unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB) == nil {
			f.Close() // no owner: a stale claim
			// A runnerd that is down (killed, restarting) keeps its
			// range for its return while its state directory exists: a
			// new default choice avoids it where it can (resting).
			if _, serr := os.Stat(c.StateDir); derr == nil && c.StateDir != "" && serr == nil {
				resting = append(resting, c)
				continue
			}
			os.Remove(n)
			continue
		}
		f.Close()
		if derr != nil {
			// Locked but not yet written cannot be: files are written
			// under the directory lock this caller holds.
			return nil, nil, fmt.Errorf("read claim %s: %w", n, derr)
		}
		live = append(live, c)
	}
	return live, resting, nil
}

// tableFile is where the netpolicy state directory's table name is saved.
const tableFile = "table"

// claimNet fills c's network fields from cfg (resolving
// cfg.NetPolicyState and setting cfg.netTable) and fails with errClaimed
// naming the other runnerd when a live one holds the same netpolicy state
// directory, or, in the same network namespace, an overlapping pool or a
// table with the same interface prefix.
func claimNet(cfg *Config, c *claim, sum [32]byte, others []claim) error {
	cfg.NetPolicyState = netPolicyState(*cfg)
	state, err := filepath.Abs(cfg.NetPolicyState)
	if err != nil {
		return fmt.Errorf("claim netpolicy state: %w", err)
	}
	if r, err := filepath.EvalSymlinks(state); err == nil {
		state = r
	}
	nsPath := cfg.NetPolicyHostNetNS
	if nsPath == "" {
		nsPath = "/proc/self/ns/net"
	}
	var st unix.Stat_t
	if err := unix.Stat(nsPath, &st); err != nil {
		return fmt.Errorf("claim netpolicy state: stat network namespace %s: %w", nsPath, err)
	}
	pool := cfg.NetPolicyPool
	if !pool.IsValid() {
		pool = netpolicy.DefaultPool
	}
	pool = pool.Masked()
	c.NetState, c.NetNS, c.Pool = state, fmt.Sprintf("%d:%d", st.Dev, st.Ino), pool.String()
	for _, o := range others {
		if o.NetState == c.NetState {
			return fmt.Errorf("netpolicy state directory %s is used by %s: give each runnerd its own --netpolicy-state: %w", c.NetState, o, errClaimed)
		}
		if o.NetNS != c.NetNS || o.Pool == "" {
			continue
		}
		if op, err := netip.ParsePrefix(o.Pool); err == nil && op.Overlaps(pool) {
			return fmt.Errorf("address pool %s overlaps %s of %s: give each runnerd its own --netpolicy-pool: %w", pool, op, o, errClaimed)
		}
	}
	if c.Table, err = netTable(cfg.NetPolicyState, sum, c.NetNS, others); err != nil {
		return err
	}
	cfg.netTable = c.Table
	return nil
}

// netTable returns the table of the netpolicy state directory state: the
// saved name, else DefaultTable when the directory holds sandboxes, else
// TablePrefix and the first 4 hex digits from sum's no live runnerd in
// the namespace ns uses; a new choice is saved. A saved name that a live
// runnerd in ns uses (a copied state directory) is refused.
func netTable(state string, sum [32]byte, ns string, others []claim) (string, error) {
	taken := func(table string) *claim {
		for i, o := range others {
			if o.NetNS == ns && o.Table != "" && netpolicy.IfPrefix(o.Table) == netpolicy.IfPrefix(table) {
				return &others[i]
			}
		}
		return nil
	}
	saved := filepath.Join(state, tableFile)
	b, err := os.ReadFile(saved)
	if err == nil {
		table := strings.TrimSpace(string(b))
		if table == "" || len(table) > 64 {
			return "", fmt.Errorf("%s: not a table name", saved)
		}
		if o := taken(table); o != nil {
			return "", fmt.Errorf("nftables table %s (%s) is used by %s: give each runnerd its own --netpolicy-state: %w", table, saved, o, errClaimed)
		}
		return table, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("read %s: %w", saved, err)
	}
	table := ""
	if recs, _ := filepath.Glob(filepath.Join(state, "sandboxes", "*.json")); len(recs) > 0 {
		// Sandboxes of a version that shared DefaultTable: their rules
		// and veths are there.
		table = netpolicy.DefaultTable
		if o := taken(table); o != nil {
			return "", fmt.Errorf("nftables table %s (the sandboxes in %s were made in it) is used by %s: %w", table, state, o, errClaimed)
		}
	} else {
		start := binary.BigEndian.Uint16(sum[8:10])
		for i := 0; i < 1<<16 && table == ""; i++ {
			t := fmt.Sprintf("%s%04x", netpolicy.TablePrefix, start+uint16(i))
			if taken(t) == nil {
				table = t
			}
		}
		if table == "" {
			return "", fmt.Errorf("no nftables table name is free: every one is held by another runnerd: %w", errClaimed)
		}
	}
	if err := os.MkdirAll(state, 0o700); err != nil {
		return "", fmt.Errorf("save nftables table name: %w", err)
	}
	if err := atomicfile.WriteFileSync(saved, []byte(table+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("save nftables table name: %w", err)
	}
	return table, nil
}

// defaultIdentityRange sets cfg's range: the saved one, else the legacy
// slot 0 for a registry that holds identities, else the first slot from
// the state directory's hash that no live runnerd overlaps; a new choice
// is saved.
func defaultIdentityRange(cfg *Config, sum [32]byte, hasIdentities bool, others, resting []claim) error {
	saved := filepath.Join(cfg.StateDir, identityRangeFile)
	slotSize, slots := uint32(identitySlotSize), uint32(identitySlots)
	if cfg.Isolate == IsolatePod {
		saved, slotSize, slots = filepath.Join(cfg.StateDir, subidRangeFile), podSlotSize, podSlots
		hasIdentities = false // the legacy slot 0 is for uid identities
	}
	if b, err := os.ReadFile(saved); err == nil {
		first, last, err := ParseIdentityRange(strings.TrimSpace(string(b)))
		if err == nil {
			err = sandboxes.CheckIdentityRange(first, last)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", saved, err)
		}
		cfg.IdentityFirst, cfg.IdentityLast = first, last
		return nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	slot := func(k uint32) (uint32, uint32) {
		first := identitySlotFirst + k*slotSize
		return first, first + slotSize - 1
	}
	first, last := slot(0)
	if !hasIdentities {
		start := binary.BigEndian.Uint32(sum[:4]) % slots
		found := false
		// First a slot no runnerd holds, live or down (its state
		// directory still there: it comes back to its saved range); then
		// one no live runnerd holds.
		for _, avoid := range [][]claim{append(slices.Clone(others), resting...), others} {
			for i := uint32(0); i < slots && !found; i++ {
				first, last = slot((start + i) % slots)
				found = true
				for _, o := range avoid {
					if o.IdentityFirst <= last && first <= o.IdentityLast {
						found = false
						break
					}
				}
			}
			if found {
				break
			}
		}
		if !found {
			return fmt.Errorf("no identity range is free: every one is held by another runnerd: %w", errClaimed)
		}
	}
	if err := atomicfile.WriteFileSync(saved, fmt.Appendf(nil, "%d-%d\n", first, last), 0o600); err != nil {
		return fmt.Errorf("save identity range: %w", err)
	}
	cfg.IdentityFirst, cfg.IdentityLast = first, last
	return nil
}

// ownCgroupFile is where runnerd reads its own cgroups; tests point it at
// a file of their own.
var ownCgroupFile = "/proc/self/cgroup"

// claimedControllers are the v1 hierarchies a sandbox's cgroups live in
// (cgroup's v1 controllers).
var claimedControllers = map[string]bool{"memory": true, "pids": true, "cpu": true, "cpuacct": true, "freezer": true}

// resolveCgroupRoots is the cgroup root in every hierarchy runnerd's own
// cgroup file lists that a sandbox lives in, as "controller:path": an
// absolute root as it is, a relative one inside runnerd's own cgroup of
// that hierarchy (as containerd's cgroup1.NestedPath places it).
func resolveCgroupRoots(root string) ([]string, error) {
	if root == "" {
		root = cgroup.DefaultRoot
	}
	b, err := os.ReadFile(ownCgroupFile)
	if err != nil {
		return nil, fmt.Errorf("read own cgroup: %w", err)
	}
	var v1, unified []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		p := path.Clean(root)
		if !strings.HasPrefix(root, "/") {
			p = path.Join("/", parts[2], root)
		}
		if parts[1] == "" {
			unified = append(unified, ":"+p)
			continue
		}
		for _, ctrl := range strings.Split(parts[1], ",") {
			if claimedControllers[ctrl] {
				v1 = append(v1, ctrl+":"+p)
			}
		}
	}
	// The unified hierarchy holds sandboxes only where no v1 controller
	// of theirs is mounted (cgroup.New picks v1 on a hybrid host).
	if len(v1) > 0 {
		return v1, nil
	}
	return unified, nil
}

// sharedRoot returns an entry of a that b holds too, or "".
func sharedRoot(a, b []string) string {
	for _, x := range a {
		for _, y := range b {
			if x == y {
				return x
			}
		}
	}
	return ""
}

// resolveCgroupRoot is the cgroup root as cgroup.New will place it: an
// absolute root as it is, a relative one inside runnerd's own cgroup (the
// memory controller's under v1, the unified one under v2).
func resolveCgroupRoot(root string) (string, error) {
	if root == "" {
		root = cgroup.DefaultRoot
	}
	if strings.HasPrefix(root, "/") {
		return path.Clean(root), nil
	}
	b, err := os.ReadFile(ownCgroupFile)
	if err != nil {
		return "", fmt.Errorf("read own cgroup: %w", err)
	}
	own, unified := "", ""
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[1] == "":
			unified = parts[2]
		case strings.Contains(","+parts[1]+",", ",memory,"):
			own = parts[2]
		}
	}
	if own == "" {
		own = unified
	}
	return path.Join("/", own, root), nil
}
