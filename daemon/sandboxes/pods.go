package sandboxes

// Pods (Config.Pods, --isolate pod; docs/isolation.md, "The pod"): each
// sandbox is a pod, a holder process owning a user, mount, pid, ipc, uts
// and cgroup namespace in the sandbox's network namespace, made once and
// joined by every session (sessiondir.Spec.Pod). The manager makes it at
// create and resume, adopts it after a restart (by the pid and start time
// the record keeps), ends it at suspend and destroy.
//
// What a pod is made of, all the sandbox's own and all in directories
// only root can change: its subordinate block (the record's Identity is
// the block's first id, uid 0 inside, allocated with the record), its
// workspace (bound at pod.WorkspacePath), its private directory's tmp and
// var-tmp (/tmp, /var/tmp inside) and pod (the overlay's upper layers:
// what root inside installs), its network namespace and resolver, its
// cgroup (the holder sits in the leaf "_pod", which no session id can
// name). On a budget driver all of it is on the sandbox's volume.
//
// The holder's pid and start time are also written to STATE/pods/NAME
// ("PID START\n"), for the operator and for a test harness that must end
// the processes a killed runnerd left: the record stays the truth.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentrunner/runner/daemon/apierr"
	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/internal/atomicfile"
	"github.com/agentrunner/runner/netpolicy"
	"github.com/agentrunner/runner/pod"
	"github.com/agentrunner/runner/seccomp"
	"github.com/agentrunner/runner/shim/sessiondir"
	"golang.org/x/sys/unix"
)

// podLeaf is the holder's cgroup leaf under its sandbox's cgroup: not a
// session id (those start with a letter or digit), so no session's leaf
// is the holder's, and the leaf sweep keeps it while the holder lives in
// it (it releases only leaves without a process).
const podLeaf = "_pod"

// podCreateTimeout bounds a pod's creation, which outlives the request
// that asked for it (a client that goes away must not leave half a pod).
const podCreateTimeout = 60 * time.Second

// pods are the holders this runnerd made or adopted, by sandbox name.
type pods struct {
	mu sync.Mutex
	m  map[string]*pod.Pod
}

func (t *pods) get(name string) *pod.Pod {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.m[name]
}

func (t *pods) put(name string, p *pod.Pod) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[string]*pod.Pod{}
	}
	t.m[name] = p
}

func (t *pods) take(name string) *pod.Pod {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.m[name]
	delete(t.m, name)
	return p
}

// PodWorkspace is where a pod's commands see its workspace.
const PodWorkspace = pod.WorkspacePath

// InPod says sb's commands run in its pod.
func InPod(sb registry.Sandbox) bool { return sb.Pod != nil }

// podFile is where the holder of sandbox name is written for the operator.
func (s *Manager) podFile(name string) string {
	return filepath.Join(s.cfg.StateDir, "pods", name)
}

// upperDir is sb's overlay upper layers: in its private directory (on its
// volume when it has one), so a park keeps them and a destroy removes them
// with it.
func (s *Manager) upperDir(sb registry.Sandbox) string {
	return filepath.Join(s.privateTmpDir(sb), "pod")
}

// PodReady returns sb's pod as a session spec names it when this runnerd
// holds it running and nothing is to be done (the warm spawn path); nil
// otherwise (PodFor does the work).
func (s *Manager) PodReady(sb registry.Sandbox) *sessiondir.PodRef {
	p := s.pods.get(sb.Name)
	if p == nil || sb.Pod == nil || sb.Pod.PID != p.PID() || sb.Pod.StartTime != p.StartTime() || !alive(p) {
		return nil
	}
	return &sessiondir.PodRef{PID: p.PID(), StartTime: p.StartTime()}
}

// PodFor returns the running pod of sb (a sandbox in a pod, running),
// adopting the holder its record names or making a new one when that one
// is gone (a reboot, a holder killed): the sessions of a sandbox always
// find its pod. The caller holds sb's lock.
func (s *Manager) PodFor(ctx context.Context, sb registry.Sandbox) (*sessiondir.PodRef, error) {
	p, err := s.ensurePod(ctx, sb)
	if err != nil {
		return nil, err
	}
	return &sessiondir.PodRef{PID: p.PID(), StartTime: p.StartTime()}, nil
}

// ensurePod is PodFor's work. The caller holds sb's lock.
func (s *Manager) ensurePod(ctx context.Context, sb registry.Sandbox) (*pod.Pod, error) {
	if sb.Pod == nil || sb.Identity == nil {
		return nil, apierr.Unavailable("sandbox %q has no pod", sb.Name)
	}
	nsb, err := s.podNet(ctx, sb)
	if err != nil {
		return nil, err
	}
	netns := ""
	if nsb != nil {
		netns = nsb.NetNSPath
	}
	if p := s.pods.get(sb.Name); p != nil {
		if p.PID() == sb.Pod.PID && p.StartTime() == sb.Pod.StartTime && alive(p) && inNetNS(p.PID(), netns) {
			return p, nil
		}
		s.pods.take(sb.Name)
		p.Release()
	}
	if sb.Pod.PID > 0 {
		p, err := pod.Adopt(sb.Pod.PID, sb.Pod.StartTime)
		switch {
		case err == nil && inNetNS(p.PID(), netns):
			s.pods.put(sb.Name, p)
			return p, nil
		case err == nil:
			// Its network namespace was made again (a reboot of the
			// network state): a pod outside the sandbox's namespace
			// must not run a command. Its processes go with it.
			s.log.Warn("pod holder outside the sandbox's network namespace; making the pod again", "sandbox", sb.Name, "pid", sb.Pod.PID)
			if err := p.Destroy(ctx); err != nil {
				return nil, apierr.Unavailable("end the pod of sandbox %q: %v", sb.Name, err)
			}
		case !errors.Is(err, pod.ErrGone):
			return nil, apierr.Unavailable("adopt the pod of sandbox %q: %v", sb.Name, err)
		default:
			s.log.Warn("pod holder gone; making the pod again", "sandbox", sb.Name, "pid", sb.Pod.PID)
		}
	}
	return s.makePod(ctx, sb, nsb)
}

// podNet is the network namespace sb's pod lives in (nil: the host's, a
// runnerd without network policies).
func (s *Manager) podNet(ctx context.Context, sb registry.Sandbox) (*netpolicy.Sandbox, error) {
	if sb.Network == nil || s.net == nil {
		return nil, nil
	}
	return s.NetFor(ctx, sb)
}

// inNetNS says process pid is in the network namespace file netns
// ("": any).
func inNetNS(pid int, netns string) bool {
	if netns == "" {
		return true
	}
	var a, b unix.Stat_t
	if unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &a) != nil || unix.Stat(netns, &b) != nil {
		return false
	}
	return a.Dev == b.Dev && a.Ino == b.Ino
}

// compiledFilter is the sandbox filter (package seccomp's default
// profile) compiled once per runnerd, which every holder loads as it is
// (pod.Config.Seccomp): no pod start compiles it.
var compiledFilter = sync.OnceValues(func() ([]byte, error) {
	f, err := seccomp.Default()
	if err != nil {
		return nil, err
	}
	return f.MarshalBinary()
})

// current is sb as its record now says (a holder recorded since sb was
// read), or sb when the record cannot be read.
func (s *Manager) current(sb registry.Sandbox) registry.Sandbox {
	if rec, err := s.reg.GetSandbox(sb.Name); err == nil && rec.Incarnation == sb.Incarnation {
		return rec
	}
	return sb
}

// alive says p's holder still runs: its start time still names it, and
// it is not a zombie (a holder this runnerd made stays one until Destroy
// reaps it). One read of /proc/PID/stat: the warm spawn path asks too.
func alive(p *pod.Pod) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.PID()))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return false
	}
	f := strings.Fields(s[i+1:]) // state is f[0], start time f[19] (field 22)
	if len(f) < 20 || f[0] == "Z" || f[0] == "X" {
		return false
	}
	st, err := strconv.ParseUint(f[19], 10, 64)
	return err == nil && st == p.StartTime()
}

// makePod makes sb's pod and records its holder; a pod whose record
// cannot be written is ended again. The caller holds sb's lock.
func (s *Manager) makePod(ctx context.Context, sb registry.Sandbox, nsb *netpolicy.Sandbox) (*pod.Pod, error) {
	cfg, err := s.podConfig(ctx, sb, nsb)
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), podCreateTimeout)
	defer cancel()
	p, err := pod.Create(pctx, cfg)
	if err != nil {
		if errors.Is(err, pod.ErrInvalid) {
			return nil, apierr.Invalid("make the pod of sandbox %q: %v", sb.Name, err)
		}
		return nil, apierr.Unavailable("make the pod of sandbox %q: %v", sb.Name, err)
	}
	if err := s.recordPod(sb.Name, &registry.Pod{PID: p.PID(), StartTime: p.StartTime()}); err != nil {
		if derr := p.Destroy(pctx); derr != nil {
			s.log.Error("end a pod whose record failed", "sandbox", sb.Name, "pid", p.PID(), "err", derr)
		}
		return nil, err
	}
	s.pods.put(sb.Name, p)
	s.log.Info("pod made", "sandbox", sb.Name, "pid", p.PID(), "uid_base", sb.Identity.UID)
	return p, nil
}

// podConfig is what sb's pod is made of (see the file comment).
func (s *Manager) podConfig(ctx context.Context, sb registry.Sandbox, nsb *netpolicy.Sandbox) (pod.Config, error) {
	priv, err := s.ensurePrivateTmp(sb)
	if err != nil {
		return pod.Config{}, err
	}
	upper := s.upperDir(sb)
	if err := os.Mkdir(upper, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return pod.Config{}, apierr.Unavailable("make the pod's upper directory: %v", err)
	}
	cfg := pod.Config{
		Holder:    s.cfg.PodHolder,
		Name:      sb.Name,
		UIDBase:   sb.Identity.UID,
		Upper:     upper,
		Workspace: sb.Workspace,
		Tmp:       filepath.Join(priv, "tmp"),
		VarTmp:    filepath.Join(priv, "var-tmp"),
		// The host's resolver, or the sandbox's own when contained.
		ResolvConf: "/etc/resolv.conf",
		Binds:      s.cfg.PodBinds,
	}
	if nsb != nil {
		cfg.NetNS, cfg.ResolvConf = nsb.NetNSPath, nsb.ResolvConfPath
	}
	if cfg.Seccomp, err = compiledFilter(); err != nil {
		return pod.Config{}, apierr.Unavailable("build the seccomp filter: %v", err)
	}
	if s.cg != nil {
		if err := s.EnsureCgroup(sb); err != nil {
			return pod.Config{}, err
		}
		// A holder is only ever in this leaf: one still there while a
		// new pod is made is one a runnerd killed between the holder's
		// start and its record made and never recorded. It goes, with
		// its pod, before the new one is made.
		if err := s.cg.RemoveSession(ctx, sb.Name, podLeaf); err != nil {
			return pod.Config{}, apierr.Unavailable("end an unrecorded pod of sandbox %q: %v", sb.Name, err)
		}
		if cfg.Cgroups, err = s.cg.SessionDirs(sb.Name, podLeaf); err != nil {
			return pod.Config{}, apierr.Unavailable("make the pod's cgroup: %v", err)
		}
	}
	return cfg, nil
}

// recordPod records sandbox name's holder (nil fields: none runs) in its
// record and in STATE/pods/NAME.
func (s *Manager) recordPod(name string, h *registry.Pod) error {
	_, err := s.reg.UpdateSandbox(name, func(rec *registry.Sandbox) error {
		if rec.Pod == nil {
			return fmt.Errorf("sandbox %q is not in a pod", name)
		}
		rec.Pod = h
		return nil
	})
	if err != nil {
		return s.RegistryErr(err, name)
	}
	if h.PID == 0 {
		if err := os.Remove(s.podFile(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			s.log.Warn("remove pod file", "sandbox", name, "err", err)
		}
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(s.podFile(name)), 0o700); err == nil {
		err = atomicfile.WriteFileSync(s.podFile(name), fmt.Appendf(nil, "%d %d\n", h.PID, h.StartTime), 0o600)
		if err != nil {
			s.log.Warn("write pod file", "sandbox", name, "err", err)
		}
	}
	return nil
}

// endPod ends sb's pod, if one runs, and records that none does (unless
// the record is about to go: destroying). Every process of the pod dies
// with its holder (the kernel ends a pid namespace with its init). The
// caller holds sb's lock and has stopped its sessions.
func (s *Manager) endPod(ctx context.Context, sb registry.Sandbox, destroying bool) error {
	if sb.Pod == nil {
		return nil
	}
	p := s.pods.take(sb.Name)
	if p == nil && sb.Pod.PID > 0 {
		var err error
		p, err = pod.Adopt(sb.Pod.PID, sb.Pod.StartTime)
		if err != nil && !errors.Is(err, pod.ErrGone) {
			return apierr.Unavailable("find the pod of sandbox %q: %v", sb.Name, err)
		}
	}
	if p != nil {
		if err := p.Destroy(ctx); err != nil {
			return apierr.Unavailable("end the pod of sandbox %q: %v", sb.Name, err)
		}
		s.log.Info("pod ended", "sandbox", sb.Name, "pid", p.PID())
	}
	if destroying {
		if err := os.Remove(s.podFile(sb.Name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return apierr.Unavailable("remove pod file: %v", err)
		}
		return nil
	}
	return s.recordPod(sb.Name, &registry.Pod{})
}

// ReleasePods lets go of the holders this runnerd holds, which keep
// running (runnerd stops, its pods and sessions stay).
func (s *Manager) ReleasePods() {
	s.pods.mu.Lock()
	defer s.pods.mu.Unlock()
	for name, p := range s.pods.m {
		p.Release()
		delete(s.pods.m, name)
	}
}

// podUser is the user sb's commands run as inside its pod, as
// sessiondir.Spec.User takes it: "uid:gid" of the pod's user namespace.
// The sandbox's user is "" (root), numeric ("uid" or "uid:gid"), or a
// name of the host's user database, which is the pod's as made (its
// /etc is the host's below the sandbox's changes).
func podUser(name string) (string, error) {
	if name == "" {
		return "0:0", nil
	}
	if uid, gid, err := sessiondir.PodUser(name); err == nil {
		return fmt.Sprintf("%d:%d", uid, gid), nil
	}
	if strings.ContainsAny(name, ":") {
		return "", apierr.Invalid("user %q: want a name, uid or uid:gid below %d", name, pod.BlockSize)
	}
	u, err := user.Lookup(name)
	if err != nil {
		return "", apierr.Invalid("user %q: %v", name, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if uid >= pod.BlockSize || gid >= pod.BlockSize {
		return "", apierr.Invalid("user %q is uid %d gid %d: a pod maps ids below %d", name, uid, gid, pod.BlockSize)
	}
	return fmt.Sprintf("%d:%d", uid, gid), nil
}

// PodSpec makes spec run in sb's pod p as user inside (empty: the
// sandbox's user), joining the pod rather than making anything
// (sessiondir.Spec.Pod). Dir is the caller's.
func (s *Manager) PodSpec(sb registry.Sandbox, p *sessiondir.PodRef, user string, spec *sessiondir.Spec) error {
	if user == "" {
		user = sb.User
	}
	u, err := podUser(user)
	if err != nil {
		return err
	}
	spec.Pod, spec.User = p, u
	return nil
}
