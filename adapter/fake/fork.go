package fake

import (
	"context"
	"fmt"
	"slices"

	"github.com/agentrunner/runner/adapter"
)

var _ adapter.Forker = (*driver)(nil)

// Fork makes sandbox name with a copy of checkpoint's files of src (src's
// files now for ""): its own incarnation, sessions, checkpoints and
// policy (opts'), sharing nothing with src.
func (a *driver) Fork(ctx context.Context, src adapter.Handle, checkpoint, name string, opts adapter.CreateOptions) (adapter.Handle, error) {
	from, err := a.lockSandbox(ctx, src)
	if err != nil {
		return adapter.Handle{}, err
	}
	defer a.mu.Unlock()
	files := from.files
	if checkpoint != "" {
		f, ok := from.checkpoints[checkpoint]
		switch {
		case !ok:
			return adapter.Handle{}, fmt.Errorf("checkpoint %s of sandbox %s: %w", checkpoint, src.Name, adapter.ErrNotFound)
		case f == nil:
			return adapter.Handle{}, &adapter.RestoreFailedError{Detail: "checkpoint " + checkpoint + " is corrupted"}
		}
		files = f
	}
	if _, ok := a.sandboxes[name]; ok {
		return adapter.Handle{}, &adapter.InvalidError{Detail: "sandbox " + name + " exists: a fork makes a new sandbox"}
	}
	sb := &sandbox{
		name:        name,
		id:          a.next("inc-"),
		files:       cloneFiles(files),
		sessions:    make(map[string]*session),
		checkpoints: make(map[string]map[string][]byte),
		urls:        make(map[int]string),
	}
	if opts.NetworkPolicy != nil {
		sb.policy = &adapter.NetworkPolicy{Allow: slices.Clone(opts.NetworkPolicy.Allow)}
	}
	a.sandboxes[name] = sb
	return a.handle(sb), nil
}
