package adapter

import (
	"context"
	"fmt"
)

// Forker is a driver that makes a new sandbox whose disk starts as a
// checkpoint of another: CapFork. checkpoint is an id Checkpoint
// returned for src, or empty for src's disk now (the driver checkpoints
// it first). The new sandbox has its own identity, network and limits
// (opts), never src's; src keeps running, unchanged; writes in either are
// invisible to the other, and destroying src leaves the fork whole.
//
// It returns ErrNotFound when src (that incarnation) or its checkpoint
// does not exist, as the provider's source of truth says; *InvalidError
// when name exists (a fork never returns an existing sandbox);
// *RestoreFailedError when the checkpoint cannot be read back (nothing is
// made). A failed fork leaves no sandbox named name.
type Forker interface {
	Fork(ctx context.Context, src Handle, checkpoint, name string, opts CreateOptions) (Handle, error)
}

// Fork makes sandbox name from checkpoint of src ([Forker]; checkpoint
// "" is src's disk now). It returns ErrNotSupported without CapFork,
// *InvalidError for a bad handle or name, or a network policy without
// CapNetworkPolicy. It is never retried: a fork whose answer was lost
// made the sandbox, and a retry would be refused as existing.
func (s *Sandboxes) Fork(ctx context.Context, src Handle, checkpoint, name string, opts CreateOptions) (Handle, error) {
	if err := s.gate(CapFork, "fork"); err != nil {
		return Handle{}, err
	}
	if err := s.CheckHandle(src); err != nil {
		return Handle{}, err
	}
	if err := s.checkName(name); err != nil {
		return Handle{}, err
	}
	if name == src.Name {
		return Handle{}, &InvalidError{Detail: fmt.Sprintf("fork of %q into itself", name)}
	}
	if opts.NetworkPolicy != nil {
		if err := s.gate(CapNetworkPolicy, "fork "+name+" with a network policy"); err != nil {
			return Handle{}, err
		}
	}
	h, err := s.fork.Fork(ctx, src, checkpoint, name, opts)
	return h, s.classify(err)
}
