package hosted_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/hosted"
	"github.com/agentrunner/runner/adapter/hosted/hostedtest"
)

const version = "v0.0.0-hosted-test"

// shimExec answers runner-shim's version call with version (or exits 127,
// a guest without runner-shim); any other call is a transport failure.
type shimExec struct {
	missing   bool
	installed atomic.Bool
	calls     atomic.Int64
}

func (x *shimExec) Exec(_ context.Context, argv []string, _ io.Reader, stdout io.Writer, _ time.Duration) (int, error) {
	x.calls.Add(1)
	if x.missing && !x.installed.Load() {
		return 127, nil
	}
	if argv[len(argv)-1] == "version" {
		fmt.Fprintf(stdout, "{\"version\":%q}\n", version)
		return 0, nil
	}
	return 0, &adapter.UnavailableError{Detail: "test executor runs only version"}
}

// driver is a stateful model of a provider: sandboxes by name, ids minted
// per incarnation, every call counted.
type driver struct {
	caps adapter.Capabilities
	exec *shimExec
	// createDelay holds each Create, so overlapping creates would show.
	createDelay time.Duration

	mu        sync.Mutex // guards the fields below
	sandboxes map[string]string
	seq       int
	inCreate  int
	overlap   bool
	opens     int
	opened    int
	closes    int
	discarded []error
}

func newDriver(caps ...adapter.Capability) *driver {
	return &driver{caps: caps, exec: &shimExec{}, sandboxes: map[string]string{}}
}

func (d *driver) Provider() string                   { return "model" }
func (d *driver) Capabilities() adapter.Capabilities { return d.caps }

func (d *driver) Create(_ context.Context, name string, _ adapter.CreateOptions) (hosted.Created, error) {
	d.mu.Lock()
	d.inCreate++
	if d.inCreate > 1 {
		d.overlap = true
	}
	d.mu.Unlock()
	time.Sleep(d.createDelay)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.inCreate--
	id, ok := d.sandboxes[name]
	if !ok {
		d.seq++
		id = fmt.Sprintf("id-%d", d.seq)
		d.sandboxes[name] = id
	}
	return hosted.Created{Handle: adapter.Handle{Provider: "model", Name: name, ID: id}, New: !ok}, nil
}

func (d *driver) Get(_ context.Context, name string) (adapter.Handle, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	id, ok := d.sandboxes[name]
	if !ok {
		return adapter.Handle{}, adapter.ErrNotFound
	}
	return adapter.Handle{Provider: "model", Name: name, ID: id}, nil
}

func (d *driver) List(context.Context, adapter.ListOptions) (adapter.Page, error) {
	return adapter.Page{}, &adapter.UnavailableError{Detail: "cut"}
}

func (d *driver) Destroy(_ context.Context, h adapter.Handle) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.sandboxes[h.Name] == h.ID {
		delete(d.sandboxes, h.Name)
	}
	return nil
}

func (d *driver) Open(context.Context, adapter.Handle) (*hosted.Transport, error) {
	d.mu.Lock()
	d.opens++
	d.mu.Unlock()
	return &hosted.Transport{Exec: d.exec,
		Opened: func(context.Context) { d.mu.Lock(); d.opened++; d.mu.Unlock() },
		Close:  func() { d.mu.Lock(); d.closes++; d.mu.Unlock() }}, nil
}

func (d *driver) Discard(ctx context.Context, h adapter.Handle, err error) {
	d.mu.Lock()
	d.discarded = append(d.discarded, err)
	d.mu.Unlock()
	d.Destroy(ctx, h)
}

func newAdapter(t *testing.T, d *driver) *hosted.Adapter {
	t.Helper()
	a, err := hosted.New(d, hosted.Config{Version: version})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

// TestGateRefusesUnadvertised: every call behind a capability the driver
// does not advertise is not_supported, and the driver is never asked.
func TestGateRefusesUnadvertised(t *testing.T) {
	d := newDriver()
	a := newAdapter(t, d)
	ctx := context.Background()
	h := adapter.Handle{Provider: "model", Name: "box", ID: "id-1"}
	calls := map[string]error{
		"create with a network policy": func() error {
			_, err := a.Create(ctx, "box", adapter.CreateOptions{NetworkPolicy: &adapter.NetworkPolicy{}})
			return err
		}(),
		"spawn with a tty": func() error {
			_, err := a.Spawn(ctx, h, adapter.Shell("true"), adapter.SpawnOptions{TTY: &adapter.TTYSize{Rows: 1, Cols: 1}})
			return err
		}(),
		"attach": func() error { _, err := a.Attach(ctx, h, "s1", adapter.Cursor{}); return err }(),
		"resize": a.Resize(ctx, h, "s1", adapter.TTYSize{Rows: 1, Cols: 1}),
		"terminate": func() error {
			_, err := a.TerminateSession(ctx, h, "s1", adapter.MinGrace)
			return err
		}(),
	}
	for name, err := range calls {
		if !errors.Is(err, adapter.ErrNotSupported) {
			t.Errorf("%s: got %v, want not_supported", name, err)
		}
	}
	if d.opens != 0 || len(d.sandboxes) != 0 {
		t.Errorf("the driver was asked: %d opens, %d sandboxes", d.opens, len(d.sandboxes))
	}
}

// TestHandleChecks: a handle of another provider or without an id is
// invalid, a bad name is invalid before the driver sees it, and a closed
// adapter refuses.
func TestHandleChecks(t *testing.T) {
	d := newDriver(adapter.CapAttach)
	a := newAdapter(t, d)
	ctx := context.Background()
	var inv *adapter.InvalidError
	for _, h := range []adapter.Handle{{Provider: "other", Name: "box", ID: "id-1"}, {Provider: "model", Name: "box"}} {
		if _, err := a.Sessions(ctx, h); !errors.As(err, &inv) {
			t.Errorf("Sessions(%v): got %v, want invalid", h, err)
		}
	}
	for _, name := range []string{"", "Box", "-box", "a_b"} {
		if _, err := a.Create(ctx, name, adapter.CreateOptions{}); !errors.As(err, &inv) {
			t.Errorf("Create(%q): got %v, want invalid", name, err)
		}
		if _, err := a.Get(ctx, name); !errors.As(err, &inv) {
			t.Errorf("Get(%q): got %v, want invalid", name, err)
		}
	}
	if err := a.Destroy(ctx, adapter.Handle{Provider: "model", Name: "box"}); !errors.As(err, &inv) {
		t.Errorf("Destroy without id: got %v, want invalid", err)
	}
	if len(d.sandboxes) != 0 || d.opens != 0 {
		t.Errorf("the driver was asked: %d opens, %d sandboxes", d.opens, len(d.sandboxes))
	}
	a.Close()
	if _, err := a.Guest(ctx, adapter.Handle{Provider: "model", Name: "box", ID: "id-1"}); !errors.As(err, &inv) {
		t.Errorf("after Close: got %v, want invalid", err)
	}
}

// TestGuestCache: one Open per incarnation, a cached id under another
// name is not_found without asking the driver, and Forget closes the
// transport so the next use opens it again.
func TestGuestCache(t *testing.T) {
	d := newDriver(adapter.CapAttach)
	a := newAdapter(t, d)
	ctx := context.Background()
	h := hostedtest.Create(t, ctx, a, "box")
	g1, err := a.Guest(ctx, h)
	if err != nil {
		t.Fatal(err)
	}
	g2, err := a.Guest(ctx, h)
	if err != nil || g1 != g2 {
		t.Fatalf("second Guest: got %p, %v, want the cached %p", g2, err, g1)
	}
	if d.opens != 1 || d.opened != 1 {
		t.Fatalf("got %d opens, %d opened, want 1, 1", d.opens, d.opened)
	}
	other := h
	other.Name = "other"
	if _, err := a.Guest(ctx, other); !errors.Is(err, adapter.ErrNotFound) {
		t.Fatalf("another name on a cached id: got %v, want not_found", err)
	}
	a.Forget(h.ID)
	if d.closes != 1 {
		t.Fatalf("Forget: got %d closes, want 1", d.closes)
	}
	if _, err := a.Guest(ctx, h); err != nil || d.opens != 2 {
		t.Fatalf("after Forget: got %v, %d opens, want nil, 2", err, d.opens)
	}
	if err := a.Destroy(ctx, h); err != nil || d.closes != 2 {
		t.Fatalf("Destroy: got %v, %d closes, want nil, 2", err, d.closes)
	}
}

// TestCreateVerifies: a new sandbox without runner-shim and no installer
// is refused as a provider error and handed to Discard (nothing
// half-made); an installer at create is run before verifying; an adopted
// sandbox is never discarded.
func TestCreateVerifies(t *testing.T) {
	ctx := context.Background()
	t.Run("missing", func(t *testing.T) {
		d := newDriver()
		d.exec.missing = true
		a := newAdapter(t, d)
		_, err := a.Create(ctx, "box", adapter.CreateOptions{})
		if !errors.Is(err, adapter.ErrProvider) {
			t.Fatalf("got %v, want provider error", err)
		}
		if len(d.discarded) != 1 || !errors.Is(d.discarded[0], adapter.ErrProvider) || len(d.sandboxes) != 0 {
			t.Fatalf("discarded %v, %d sandboxes left, want one provider error, none", d.discarded, len(d.sandboxes))
		}
	})
	t.Run("adopted", func(t *testing.T) {
		d := newDriver()
		d.sandboxes["box"] = "id-old"
		d.exec.missing = true
		a := newAdapter(t, d)
		if _, err := a.Create(ctx, "box", adapter.CreateOptions{}); !errors.Is(err, adapter.ErrProvider) {
			t.Fatalf("got %v, want provider error", err)
		}
		if len(d.discarded) != 0 || d.sandboxes["box"] != "id-old" {
			t.Fatalf("an adopted sandbox was discarded: %v", d.discarded)
		}
	})
	t.Run("install at create", func(t *testing.T) {
		d := newDriver()
		d.exec.missing = true
		var installs atomic.Int64
		tr := &hosted.Transport{Exec: d.exec, InstallAtCreate: true,
			Install: func(context.Context) error { installs.Add(1); d.exec.installed.Store(true); return nil }}
		drv := &transportDriver{driver: d, t: tr}
		a2, err := hosted.New(drv, hosted.Config{Version: version})
		if err != nil {
			t.Fatal(err)
		}
		defer a2.Close()
		if _, err := a2.Create(ctx, "box", adapter.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if installs.Load() != 1 || d.exec.calls.Load() != 1 || drv.opens != 0 {
			t.Fatalf("got %d installs, %d execs, %d opens; want 1, 1 (the version), 0", installs.Load(), d.exec.calls.Load(), drv.opens)
		}
	})
}

// transportDriver returns its transport from Create, as Sprites does.
type transportDriver struct {
	*driver
	t *hosted.Transport
}

func (d *transportDriver) Create(ctx context.Context, name string, opts adapter.CreateOptions) (hosted.Created, error) {
	c, err := d.driver.Create(ctx, name, opts)
	c.Transport = d.t
	return c, err
}

// TestCreateSerializesName: concurrent creates of one name never overlap
// in the driver (a driver that lists, then creates, would make two).
func TestCreateSerializesName(t *testing.T) {
	d := newDriver()
	d.createDelay = 20 * time.Millisecond
	a := newAdapter(t, d)
	var wg sync.WaitGroup
	ids := make([]string, 4)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h, err := a.Create(context.Background(), "box", adapter.CreateOptions{})
			if err != nil {
				t.Error(err)
			}
			ids[i] = h.ID
		}()
	}
	wg.Wait()
	if d.overlap {
		t.Fatal("creates of one name overlapped in the driver")
	}
	for _, id := range ids {
		if id != ids[0] {
			t.Fatalf("got ids %v, want one", ids)
		}
	}
}

func TestNewRequiresDriverAndVersion(t *testing.T) {
	var inv *adapter.InvalidError
	if _, err := hosted.New(nil, hosted.Config{Version: version}); !errors.As(err, &inv) {
		t.Errorf("no driver: got %v, want invalid", err)
	}
	if _, err := hosted.New(newDriver(), hosted.Config{}); !errors.As(err, &inv) {
		t.Errorf("no version: got %v, want invalid", err)
	}
}
