package daemon

import (
	"net/http"

	"github.com/agentrunner/runner/cgroup"
	"github.com/agentrunner/runner/wire"
)

// handleInfo is GET /v1/info: the operator's view of this runnerd in one
// read (runner info, as docker info is dockerd's). Everything in it is
// read from what Run set up, never from what was asked for: cgroups say
// "off" unless limits are enforced, isolation "off" unless runnerd can
// give identities.
func (s *server) handleInfo(w http.ResponseWriter, r *http.Request) {
	c, err := s.capacity()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	info := wire.Info{
		Version:      s.cfg.Version,
		Capabilities: s.capabilities(),
		Capacity:     c,
		StateDir:     s.cfg.StateDir,
		Cgroups:      "off",
		Isolation:    "off",
	}
	if s.sbx.Cgroups() != nil {
		info.Cgroups = s.sbx.Cgroups().Mode().String()
		info.CgroupRoot = s.cfg.CgroupRoot
		if info.CgroupRoot == "" {
			info.CgroupRoot = cgroup.DefaultRoot
		}
		if on, known := cgroup.FavorDynMods(); known {
			info.CgroupFavorDynMods = &on
		}
	}
	switch {
	case s.sbx.IdentitiesEnabled() && s.cfg.Isolate == IsolatePod:
		info.Isolation = "pod"
	case s.sbx.IdentitiesEnabled() && s.cfg.Isolate == IsolateAll:
		info.Isolation = "all"
	case s.sbx.IdentitiesEnabled():
		info.Isolation = "none" // --isolate none: only sandboxes made with a policy
	}
	if s.sbx.NetPolicy() != nil {
		info.NetworkTable = s.cfg.netTable
		info.NetworkPending = int(s.sbx.NetsPending())
	}
	info.StorageDriver = s.sbx.StorageDriver()
	if info.DiskBudgets = s.sbx.DiskBudgets(); info.DiskBudgets {
		info.DefaultDiskBytes = s.cfg.DefaultDisk
	}
	if p := s.cfg.pool; p != nil {
		info.WarmShims = wire.WarmShims{Target: s.cfg.WarmShims, Idle: p.Idle()}
	}
	s.writeJSON(w, http.StatusOK, info)
}
