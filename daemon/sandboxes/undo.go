package sandboxes

// Undoing a create that failed half-way. A create validates everything it
// can before it makes anything (limits against the kernel's bounds,
// policies against the enforced maximum); what can fail only once it is
// tried (the kernel refusing or not holding a limit, a namespace that
// cannot be set up) is undone here, so a failed create leaves no sandbox,
// no cgroup, no namespace and no workspace behind, and a retry starts
// afresh instead of finding a record that claims what the kernel does
// not hold.

import (
	"context"
	"os"
	"time"

	"github.com/agentrunner/runner/daemon/registry"
)

// undoCreate removes what Create made for the new sandbox sb
// before it failed: its cgroup, its network, its workspace and volume
// (when the create made them) and its record, last, as Destroy orders them. A
// step that fails is logged and the record stays, so the sandbox is
// there to destroy (or re-create) rather than leaving files without a
// record. The caller holds sb's lock.
func (s *Manager) undoCreate(ctx context.Context, sb registry.Sandbox, madeWS, madeVol bool) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := s.endPod(ctx, s.current(sb), true); err != nil { // pods.go: before its cgroup, which it sits in
		s.log.Error("undo failed create: end pod; the sandbox stays to be destroyed", "sandbox", sb.Name, "err", err)
		return
	}
	if err := s.removeCgroup(ctx, sb.Name); err != nil {
		s.log.Error("undo failed create: remove cgroup; the sandbox stays to be destroyed", "sandbox", sb.Name, "err", err)
		return
	}
	if err := s.teardownNet(ctx, sb); err != nil {
		s.log.Error("undo failed create: tear down network; the sandbox stays to be destroyed", "sandbox", sb.Name, "err", err)
		return
	}
	s.undoWorkspace(sb.Workspace, madeWS)
	if err := s.removePrivateTmp(sb); err != nil { // no command of it ran
		s.log.Warn("undo failed create: remove private /tmp", "sandbox", sb.Name, "err", err)
	}
	if madeVol {
		// The workspace and private directories with it (disk.go).
		if err := s.deleteVolume(ctx, sb.Name); err != nil {
			s.log.Error("undo failed create: delete volume; the sandbox stays to be destroyed", "sandbox", sb.Name, "err", err)
			return
		}
	}
	if err := s.reg.DeleteSandbox(sb.Name); err != nil {
		s.log.Error("undo failed create: delete record; the sandbox stays to be destroyed", "sandbox", sb.Name, "err", err)
		return
	}
	s.log.Info("failed create undone", "sandbox", sb.Name)
}

// undoWorkspace removes a workspace this create made (made), and leaves
// one that was there before.
func (s *Manager) undoWorkspace(ws string, made bool) {
	if !made {
		return
	}
	if err := os.RemoveAll(ws); err != nil {
		s.log.Warn("undo failed create: remove workspace", "workspace", ws, "err", err)
	}
}
