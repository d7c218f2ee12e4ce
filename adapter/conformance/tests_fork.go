package conformance

// Capability/fork: a sandbox made from another's checkpoint has its files
// byte for byte, and the two never see each other's writes, in either
// direction, nor the source's destroy.

import (
	"context"
	"errors"

	"github.com/agentrunner/runner/adapter"
)

// forker is the portable fork (adapter.Sandboxes.Fork): an adapter that
// advertises fork must have it.
type forker interface {
	Fork(ctx context.Context, src adapter.Handle, checkpoint, name string, opts adapter.CreateOptions) (adapter.Handle, error)
}

func testFork(t T, h Harness) {
	e := setup(t, h)
	hd := e.create()
	f, ok := e.a.(forker)
	if !e.a.Capabilities().Has(adapter.CapFork) {
		if ok {
			_, err := f.Fork(e.ctx, hd, "", e.name(), adapter.CreateOptions{})
			e.wantKind("Fork without the capability", err, adapter.ErrNotSupported)
		}
		return
	}
	if !ok {
		t.Fatalf("the adapter advertises %s but has no Fork method", adapter.CapFork)
	}
	e.requireFiles("fork")
	const path, content = "conformance-fork.txt", "one\tline \u2713 two"
	const inA, inB = "conformance-fork-a.txt", "conformance-fork-b.txt"
	e.writeFile(hd, path, content)
	id := ""
	if e.a.Capabilities().Has(adapter.CapCheckpoint) {
		var err error
		if id, err = e.a.Checkpoint(e.ctx, hd); err != nil || id == "" {
			t.Fatalf("Checkpoint = %q, %v", id, err)
		}
		// Written after the checkpoint: the fork of it must not have it.
		e.writeFile(hd, inA, "after the checkpoint")
	}
	fk := e.fork(f, hd, id)
	if got := e.readFile(fk, path); got != content {
		t.Errorf("the fork reads %s %q, want the source's %q", path, got, content)
	}
	if id != "" {
		if r := e.exec(fk, e.fx.ReadFile(inA)); r.Exit.Success() {
			t.Errorf("the fork of checkpoint %s reads %s %q, written in the source after it", id, inA, r.Stdout)
		}
	}
	e.writeFile(fk, inB, "in the fork")
	e.writeFile(fk, path, "changed in the fork")
	if r := e.exec(hd, e.fx.ReadFile(inB)); r.Exit.Success() {
		t.Errorf("the source reads %s %q, written in the fork", inB, r.Stdout)
	}
	if got := e.readFile(hd, path); got != content {
		t.Errorf("the source reads %s %q after the fork wrote it, want %q", path, got, content)
	}
	e.writeFile(hd, path, "changed in the source")
	if got := e.readFile(fk, path); got != "changed in the fork" {
		t.Errorf("the fork reads %s %q after the source wrote it, want its own", path, got)
	}

	// From now (no checkpoint): the source's disk as it is.
	now := e.fork(f, hd, "")
	if got := e.readFile(now, path); got != "changed in the source" {
		t.Errorf("a fork of now reads %s %q, want the source's %q", path, got, "changed in the source")
	}

	// Refusals: an existing name, an unknown checkpoint.
	_, err := f.Fork(e.ctx, hd, "", fk.Name, adapter.CreateOptions{})
	var inv *adapter.InvalidError
	if !errors.As(err, &inv) {
		t.Errorf("Fork to an existing name = %v, want invalid", err)
	}
	if got := e.readFile(fk, path); got != "changed in the fork" {
		t.Errorf("a refused fork to %s changed it: %s reads %q", fk.Name, path, got)
	}
	if id != "" {
		name := e.name()
		_, err = f.Fork(e.ctx, hd, "conformance-no-such-checkpoint", name, adapter.CreateOptions{})
		e.wantKind("Fork of an unknown checkpoint", err, adapter.ErrNotFound)
		if _, err := e.a.Get(e.ctx, name); !errors.Is(err, adapter.ErrNotFound) {
			t.Errorf("after a refused fork Get(%s) = %v, want not found", name, err)
		}
	}

	// Destroying the source keeps the fork whole.
	if err := e.a.Destroy(e.ctx, hd); err != nil {
		t.Fatalf("Destroy(source) = %v", err)
	}
	if got := e.readFile(fk, path); got != "changed in the fork" {
		t.Errorf("after the source's destroy the fork reads %s %q", path, got)
	}
}

// fork forks src's checkpoint into a new sandbox destroyed when the
// subtest ends.
func (e *env) fork(f forker, src adapter.Handle, id string) adapter.Handle {
	e.t.Helper()
	name := e.name()
	fk, err := f.Fork(e.ctx, src, id, name, adapter.CreateOptions{})
	if err != nil {
		e.t.Fatalf("Fork(%s, %q, %s) = %v", src.Name, id, name, err)
	}
	e.t.Cleanup(func() { e.destroyQuietly(fk) })
	if fk.Name != name || fk.Same(src) {
		e.t.Errorf("Fork returned %v, want a new sandbox %s", fk, name)
	}
	return fk
}
