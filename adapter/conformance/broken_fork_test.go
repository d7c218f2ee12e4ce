package conformance_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/conformance"
	"github.com/agentrunner/runner/adapter/fake"
)

// forkIgnoresCheckpoint forks the source's disk now whatever checkpoint
// is asked.
type forkIgnoresCheckpoint struct{ base }

func (b forkIgnoresCheckpoint) Fork(ctx context.Context, src adapter.Handle, _ string, name string, o adapter.CreateOptions) (adapter.Handle, error) {
	return b.base.Fork(ctx, src, "", name, o)
}

// forkReturnsExisting answers a fork to an existing name with that
// sandbox, as an idempotent create would.
type forkReturnsExisting struct{ base }

func (b forkReturnsExisting) Fork(ctx context.Context, src adapter.Handle, ck, name string, o adapter.CreateOptions) (adapter.Handle, error) {
	if h, err := b.base.Get(ctx, name); err == nil {
		return h, nil
	}
	return b.base.Fork(ctx, src, ck, name, o)
}

// forkShares runs every command of a fork in its source too: a fork that
// shares the source's disk.
type forkShares struct {
	base
	mu   *sync.Mutex
	srcs map[string]adapter.Handle // fork name to source
}

func (b forkShares) Fork(ctx context.Context, src adapter.Handle, ck, name string, o adapter.CreateOptions) (adapter.Handle, error) {
	h, err := b.base.Fork(ctx, src, ck, name, o)
	if err == nil {
		b.mu.Lock()
		b.srcs[name] = src
		b.mu.Unlock()
	}
	return h, err
}

func (b forkShares) Exec(ctx context.Context, h adapter.Handle, c adapter.Command) (adapter.Result, error) {
	b.mu.Lock()
	src, ok := b.srcs[h.Name]
	b.mu.Unlock()
	if ok && c.Path == "sh" {
		if _, err := b.base.Exec(ctx, src, c); err != nil {
			return adapter.Result{}, err
		}
	}
	return b.base.Exec(ctx, h, c)
}

// TestSuiteCatchesBrokenForks: Capability/fork fails each broken fork.
func TestSuiteCatchesBrokenForks(t *testing.T) {
	tests := []struct {
		name string
		wrap func(*fake.Adapter) adapter.Adapter
	}{
		{"fork ignores the checkpoint", func(f *fake.Adapter) adapter.Adapter { return forkIgnoresCheckpoint{base{f}} }},
		{"fork to an existing name returns it", func(f *fake.Adapter) adapter.Adapter { return forkReturnsExisting{base{f}} }},
		{"fork shares the source's disk", func(f *fake.Adapter) adapter.Adapter {
			return forkShares{base{f}, &sync.Mutex{}, map[string]adapter.Handle{}}
		}},
	}
	var fork conformance.Test
	for _, tc := range conformance.Tests() {
		if tc.Name == "Capability/fork" {
			fork = tc
		}
	}
	if fork.Func == nil {
		t.Fatal("no Capability/fork subtest")
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := run(fork, harness(tt.wrap))
			if r.skipped || !r.failed {
				t.Fatalf("Capability/fork passed (skipped %v) the broken adapter: %v", r.skipped, r.errs)
			}
			t.Logf("caught: %s", strings.Join(r.errs, "; "))
		})
	}
}
