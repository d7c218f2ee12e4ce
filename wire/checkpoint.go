package wire

import "time"

// CapCheckpoint: a sandbox's disk can be checkpointed and restored
// (POST /v1/sandboxes/{name}/checkpoints, .../checkpoints/{id}/restore).
// runnerd advertises it only where it can freeze a sandbox's processes
// (cgroups with the freezer), so a checkpoint is one instant.
const CapCheckpoint = "checkpoint"

// QueryKeepCheckpoints on DELETE /v1/sandboxes/{name} ("1" or "true")
// keeps the sandbox's checkpoints when it is destroyed: a sandbox created
// later under the same name can list and restore them.
const QueryKeepCheckpoints = "keep_checkpoints"

// MaxCheckpointComment is the longest comment a checkpoint takes, in bytes.
const MaxCheckpointComment = 1024

// CreateCheckpoint is the body of POST /v1/sandboxes/{name}/checkpoints
// (optional).
type CreateCheckpoint struct {
	Comment string `json:"comment,omitempty"`
}

// Checkpoint is one checkpoint of a sandbox's disk.
type Checkpoint struct {
	ID      string    `json:"id"`
	Sandbox string    `json:"sandbox"`
	Comment string    `json:"comment,omitempty"`
	Created time.Time `json:"created"`
	// Size is the bytes of the regular files it holds.
	Size int64 `json:"size"`
	// StoredBytes is what it added to the store when made: compressed
	// chunks no earlier checkpoint of the sandbox had.
	StoredBytes int64 `json:"stored_bytes"`
	Files       int   `json:"files"`
	// FrozenMS is how long the sandbox's processes were frozen for it.
	FrozenMS int64 `json:"frozen_ms"`
}

// Checkpoints is the answer of GET /v1/sandboxes/{name}/checkpoints,
// oldest first.
type Checkpoints struct {
	Checkpoints []Checkpoint `json:"checkpoints"`
}

// QueryArchiveBase on GET /v1/sandboxes/{name}/checkpoints/{id}/archive
// names a checkpoint of the same sandbox that the receiver already holds
// (it imported it earlier): the archive then leaves out every chunk that
// checkpoint names. A receiver without them refuses the import
// (restore_failed).
const QueryArchiveBase = "base"

// ContentTypeCheckpointArchive is the media type of a checkpoint archive
// (docs/archive.md), answered by the export route and sent to the import
// route.
const ContentTypeCheckpointArchive = "application/vnd.runner.checkpoint-archive"
