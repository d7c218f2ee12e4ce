package wire

// CapFork: POST /v1/sandboxes with From makes a new sandbox whose disk
// starts as a checkpoint of another (docs/protocol.md, "Forks").
// Advertised where checkpoints are (CapCheckpoint): a fork is a
// checkpoint put into a new sandbox.
const CapFork = "fork"

// ForkFrom is CreateSandbox.From: the sandbox and checkpoint a new
// sandbox is forked from.
type ForkFrom struct {
	// Sandbox names the source sandbox. It keeps running, unchanged.
	Sandbox string `json:"sandbox"`
	// Incarnation, when set, is the source's incarnation the fork must
	// come from: another live incarnation (the name destroyed and made
	// again) is refused with not_found, as on every call that names one.
	Incarnation string `json:"incarnation,omitempty"`
	// Checkpoint is the id of one of the source's checkpoints. Empty
	// means now: the source is checkpointed first (frozen for the
	// capture, as POST .../checkpoints does), and that checkpoint is
	// deleted again once the fork has its disk.
	Checkpoint string `json:"checkpoint,omitempty"`
}
