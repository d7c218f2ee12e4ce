package conformance

// Capability checks: the advertised capabilities are known ones, and each
// optional capability (suspend, network_policy, public_url, tty,
// checkpoint) works when advertised and is refused with the right error
// kind when not.

import (
	"errors"
	"fmt"
	"net/url"
	"slices"

	"github.com/agentrunner/runner/adapter"
)

func testCapabilitiesKnown(t T, h Harness) {
	e := setup(t, h)
	caps := e.a.Capabilities()
	seen := map[adapter.Capability]bool{}
	for _, c := range caps {
		if !slices.Contains(adapter.AllCapabilities(), c) {
			t.Errorf("Capabilities() advertises unknown capability %q", c)
		}
		if seen[c] {
			t.Errorf("Capabilities() lists %q twice", c)
		}
		seen[c] = true
	}
	if !slices.Equal(caps, e.a.Capabilities()) {
		t.Errorf("Capabilities() changed between calls")
	}
	if e.a.Provider() == "" {
		t.Errorf("Provider() is empty")
	}
}

func testSuspend(t T, h Harness) {
	e := setup(t, h)
	hd := e.create()
	if !e.a.Capabilities().Has(adapter.CapSuspend) {
		e.wantKind("Suspend without the capability", e.a.Suspend(e.ctx, hd), adapter.ErrNotSupported)
		e.wantKind("Resume without the capability", e.a.Resume(e.ctx, hd), adapter.ErrNotSupported)
		return
	}
	e.requireFiles("suspend")
	const path, content = "conformance-park.txt", "written before the park"
	e.writeFile(hd, path, content)
	for i := range 2 {
		if err := e.a.Suspend(e.ctx, hd); err != nil {
			t.Fatalf("Suspend #%d = %v", i+1, err)
		}
	}
	if got, err := e.a.Get(e.ctx, hd.Name); err != nil || !got.Same(hd) {
		t.Errorf("Get of a parked sandbox = %v, %v; want %v", got, err, hd)
	}
	for i := range 2 {
		if err := e.a.Resume(e.ctx, hd); err != nil {
			t.Fatalf("Resume #%d = %v", i+1, err)
		}
	}
	if got := e.readFile(hd, path); got != content {
		t.Errorf("after suspend and resume the file reads %q, want %q (a fresh disk is data loss)", got, content)
	}
}

func testNetworkPolicy(t T, h Harness) {
	e := setup(t, h)
	if !e.a.Capabilities().Has(adapter.CapNetworkPolicy) {
		hd := e.create()
		e.wantKind("SetNetworkPolicy without the capability", e.a.SetNetworkPolicy(e.ctx, hd, adapter.NetworkPolicy{}), adapter.ErrNotSupported)
		_, err := e.a.Create(e.ctx, e.name(), adapter.CreateOptions{NetworkPolicy: &adapter.NetworkPolicy{}})
		e.wantKind("Create with a network policy without the capability", err, adapter.ErrNotSupported)
		return
	}
	if e.fx.Probe == nil || e.fx.ProbeHost == "" {
		t.Skipf("SKIPPED, NOT VERIFIED: the adapter advertises network_policy but the harness supplies no Probe fixture, so allow: [] is unchecked")
	}
	probe := func(hd adapter.Handle) adapter.Exit {
		t.Helper()
		return e.exec(hd, e.fx.Probe(e.fx.ProbeHost)).Exit
	}
	hd := e.create()
	if err := e.a.SetNetworkPolicy(e.ctx, hd, adapter.NetworkPolicy{Allow: []string{e.fx.ProbeHost}}); err != nil {
		t.Fatalf("SetNetworkPolicy(allow %s) = %v", e.fx.ProbeHost, err)
	}
	if ex := probe(hd); !ex.Success() {
		t.Errorf("probe of the allowed host %s: %v, want success", e.fx.ProbeHost, ex)
	}
	if err := e.a.SetNetworkPolicy(e.ctx, hd, adapter.NetworkPolicy{Allow: []string{}}); err != nil {
		t.Fatalf("SetNetworkPolicy(allow: []) = %v", err)
	}
	if ex := probe(hd); ex.Success() {
		t.Errorf("probe under allow: [] succeeded: an empty allowlist must deny all egress, never be a no-op")
	}
	denied := e.createNamed(e.name(), adapter.CreateOptions{NetworkPolicy: &adapter.NetworkPolicy{}})
	if ex := probe(denied); ex.Success() {
		t.Errorf("probe in a sandbox created with allow: [] succeeded, want denied")
	}
}

func testPublicURL(t T, h Harness) {
	e := setup(t, h)
	hd := e.create()
	u, err := e.a.PublicURL(e.ctx, hd, 8080)
	if !e.a.Capabilities().Has(adapter.CapPublicURL) {
		e.wantKind(fmt.Sprintf("PublicURL without the capability (returned %q)", u), err, adapter.ErrNotSupported)
		return
	}
	if err != nil {
		// url-or-nothing: a provider may refuse a port nothing listens on,
		// as the caller's mistake (*InvalidError), never as absence; with
		// a listener it must answer a URL.
		e.wantKind("PublicURL(8080) with nothing listening", err, &adapter.InvalidError{})
		if !e.listen(hd, 8080) {
			t.Skipf("PublicURL refused a port nothing listens on, and no listener could be started in the sandbox (python3): the URL's form is not checked")
		}
		if u, err = e.a.PublicURL(e.ctx, hd, 8080); err != nil {
			t.Fatalf("PublicURL(8080) with a listener = %v", err)
		}
	}
	p, perr := url.Parse(u)
	if perr != nil || (p.Scheme != "https" && p.Scheme != "http") || p.Host == "" || p.User != nil {
		t.Errorf("PublicURL(8080) = %q, want an absolute http(s) URL with no credential in it", u)
	}
	for _, port := range []int{0, -1, 65536} {
		_, err := e.a.PublicURL(e.ctx, hd, port)
		e.wantKind(fmt.Sprintf("PublicURL(%d)", port), err, &adapter.InvalidError{})
	}
}

// listen starts a TCP listener on port in the sandbox (with python3, if
// it has one) and reports whether it listens. It lives until the sandbox
// is destroyed.
func (e *env) listen(h adapter.Handle, port int) bool {
	e.t.Helper()
	if r, err := e.a.Exec(e.ctx, h, adapter.Command{Path: "sh", Args: []string{"-c", "command -v python3"}}); err != nil || !r.Exit.Success() {
		return false
	}
	script := fmt.Sprintf("import socket,time\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\ns.bind(('0.0.0.0',%d))\ns.listen()\nprint('listening',flush=True)\ntime.sleep(600)\n", port)
	return e.spawn(h, adapter.Command{Path: "python3", Args: []string{"-c", script}}, adapter.SpawnOptions{}).stdoutHas("listening")
}

func testTTY(t T, h Harness) {
	e := setup(t, h)
	hd := e.create()
	size := &adapter.TTYSize{Rows: 24, Cols: 80}
	if !e.a.Capabilities().Has(adapter.CapTTY) {
		st, err := e.a.Spawn(e.ctx, hd, e.fx.SpawnOK, adapter.SpawnOptions{TTY: size})
		if err == nil {
			_ = st.Close()
		}
		e.wantKind("Spawn with a TTY without the capability", err, adapter.ErrNotSupported)
		r := e.spawn(hd, e.fx.SpawnOK, adapter.SpawnOptions{})
		e.wantKind("Resize without the capability", e.a.Resize(e.ctx, hd, r.st.SessionID(), *size), adapter.ErrNotSupported)
		r.rest()
		return
	}
	r := e.spawn(hd, e.fx.Stderr, adapter.SpawnOptions{TTY: size})
	r.wantExit("exit 0", success)
	if len(r.out[1]) > 0 {
		t.Errorf("TTY session delivered stderr frames %s, want one stream", quoteAll(r.out[1]))
	}
	if len(r.out[0]) == 0 {
		t.Errorf("TTY session delivered no output")
	}
	stay := e.spawn(hd, e.fx.SpawnStay, adapter.SpawnOptions{TTY: size})
	if err := e.a.Resize(e.ctx, hd, stay.st.SessionID(), adapter.TTYSize{Rows: 50, Cols: 132}); err != nil {
		t.Errorf("Resize = %v", err)
	}
	pipes := e.spawn(hd, e.fx.SpawnStay, adapter.SpawnOptions{})
	e.wantKind("Resize of a pipes session", e.a.Resize(e.ctx, hd, pipes.st.SessionID(), *size), &adapter.InvalidError{})
	for _, r := range []*reader{stay, pipes} {
		if err := e.a.CloseStdin(e.ctx, hd, r.st.SessionID()); err != nil {
			t.Errorf("CloseStdin = %v", err)
		}
		r.rest()
	}
}

func testCheckpoint(t T, h Harness) {
	e := setup(t, h)
	hd := e.create()
	if !e.a.Capabilities().Has(adapter.CapCheckpoint) {
		_, err := e.a.Checkpoint(e.ctx, hd)
		e.wantKind("Checkpoint without the capability", err, adapter.ErrNotSupported)
		e.wantKind("Restore without the capability", e.a.Restore(e.ctx, hd, "x"), adapter.ErrNotSupported)
		return
	}
	e.requireFiles("checkpoint")
	const changed, removed, added = "conformance-ckpt.txt", "conformance-ckpt-kept.txt", "conformance-ckpt-new.txt"
	const original, kept = "one\tline \u2713 two", "kept"
	e.writeFile(hd, changed, original)
	e.writeFile(hd, removed, kept)
	id, err := e.a.Checkpoint(e.ctx, hd)
	if err != nil || id == "" {
		t.Fatalf("Checkpoint = %q, %v", id, err)
	}
	// Change one file, delete another, add a third; restore brings back
	// the checkpoint's disk, byte for byte, and only it.
	e.writeFile(hd, changed, "two")
	if e.fx.RemoveFile != nil {
		if r := e.exec(hd, e.fx.RemoveFile(removed)); !r.Exit.Success() {
			t.Fatalf("RemoveFile fixture: exit %v, stderr %q", r.Exit, r.Stderr)
		}
	} else {
		e.writeFile(hd, removed, "overwritten")
	}
	e.writeFile(hd, added, "added after the checkpoint")
	if err := e.a.Restore(e.ctx, hd, id); err != nil {
		t.Fatalf("Restore = %v", err)
	}
	if got := e.readFile(hd, changed); got != original {
		t.Errorf("after Restore %s reads %q, want %q", changed, got, original)
	}
	if got := e.readFile(hd, removed); got != kept {
		t.Errorf("after Restore %s reads %q, want %q", removed, got, kept)
	}
	if r := e.exec(hd, e.fx.ReadFile(added)); r.Exit.Success() {
		t.Errorf("after Restore %s (written after the checkpoint) still reads %q, want it absent", added, r.Stdout)
	}
	err = e.a.Restore(e.ctx, hd, "conformance-no-such-checkpoint")
	var inv *adapter.InvalidError
	if !errors.As(err, &inv) {
		t.Errorf("Restore(unknown checkpoint) = %v, want invalid", err)
	}
	if e.s.CorruptCheckpoint == nil {
		skipHook(t, "CorruptCheckpoint")
	}
	id2, err := e.a.Checkpoint(e.ctx, hd)
	if err != nil {
		t.Fatalf("Checkpoint = %q, %v", id2, err)
	}
	e.writeFile(hd, changed, "after the second checkpoint")
	if err := e.s.CorruptCheckpoint(hd, id2); err != nil {
		t.Fatalf("CorruptCheckpoint hook: %v", err)
	}
	err = e.a.Restore(e.ctx, hd, id2)
	var rf *adapter.RestoreFailedError
	if !errors.As(err, &rf) {
		t.Errorf("Restore(corrupted checkpoint) = %v, want restore_failed", err)
	}
	if got := e.readFile(hd, changed); got != "after the second checkpoint" {
		t.Errorf("after a failed Restore %s reads %q, want the disk unchanged", changed, got)
	}
}
