package adapter_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
)

// model is a stateful driver with the core only: sandboxes by name, an
// id per incarnation, a queue of errors to answer with, and a count of
// the calls that reached it. Its optional features are added by the
// types that embed it.
type model struct {
	mu        sync.Mutex // guards the fields below
	sandboxes map[string]string
	seq       int
	calls     map[string]int
	fail      map[string][]error // per method: the errors to answer with, in turn
}

func newModel() *model {
	return &model{sandboxes: map[string]string{}, calls: map[string]int{}, fail: map[string][]error{}}
}

// call counts method and returns its next queued error.
func (m *model) call(method string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls[method]++
	if q := m.fail[method]; len(q) > 0 {
		m.fail[method] = q[1:]
		return q[0]
	}
	return nil
}

func (m *model) failWith(method string, errs ...error) {
	m.mu.Lock()
	m.fail[method] = append(m.fail[method], errs...)
	m.mu.Unlock()
}

func (m *model) reached() map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]int{}
	for k, v := range m.calls {
		out[k] = v
	}
	return out
}

func (m *model) Provider() string { return "model" }

func (m *model) Create(_ context.Context, name string, _ adapter.CreateOptions) (adapter.Handle, error) {
	return m.find("Create", name, true)
}

func (m *model) Get(_ context.Context, name string) (adapter.Handle, error) {
	return m.find("Get", name, false)
}

// find returns the sandbox named name, made when create is set.
func (m *model) find(method, name string, create bool) (adapter.Handle, error) {
	if err := m.call(method); err != nil {
		return adapter.Handle{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	id, ok := m.sandboxes[name]
	switch {
	case !ok && !create:
		return adapter.Handle{}, adapter.ErrNotFound
	case !ok:
		m.seq++
		id = fmt.Sprintf("id-%d", m.seq)
		m.sandboxes[name] = id
	}
	return adapter.Handle{Provider: "model", Name: name, ID: id}, nil
}

func (m *model) List(context.Context, adapter.ListOptions) (adapter.Page, error) {
	return adapter.Page{}, m.call("List")
}

func (m *model) Destroy(context.Context, adapter.Handle) error { return m.call("Destroy") }

func (m *model) Exec(context.Context, adapter.Handle, adapter.Command) (adapter.Result, error) {
	return adapter.Result{}, m.call("Exec")
}

func (m *model) Spawn(context.Context, adapter.Handle, adapter.Command, adapter.SpawnOptions) (adapter.Stream, error) {
	return nil, m.call("Spawn")
}

func (m *model) Sessions(context.Context, adapter.Handle) ([]adapter.SessionInfo, error) {
	return nil, m.call("Sessions")
}

func (m *model) WriteStdin(context.Context, adapter.Handle, string, []byte) error {
	return m.call("WriteStdin")
}

func (m *model) CloseStdin(context.Context, adapter.Handle, string) error {
	return m.call("CloseStdin")
}

// full is the model with every optional interface.
type full struct{ *model }

func (f full) Attach(context.Context, adapter.Handle, string, adapter.Cursor) (adapter.Stream, error) {
	return nil, f.call("Attach")
}
func (f full) Resize(context.Context, adapter.Handle, string, adapter.TTYSize) error {
	return f.call("Resize")
}
func (f full) TerminateSession(context.Context, adapter.Handle, string, time.Duration) (adapter.Exit, error) {
	return adapter.Exit{}, f.call("TerminateSession")
}
func (f full) Suspend(context.Context, adapter.Handle) error { return f.call("Suspend") }
func (f full) Resume(context.Context, adapter.Handle) error  { return f.call("Resume") }
func (f full) Checkpoint(context.Context, adapter.Handle) (string, error) {
	return "", f.call("Checkpoint")
}
func (f full) Restore(context.Context, adapter.Handle, string) error { return f.call("Restore") }
func (f full) Fork(context.Context, adapter.Handle, string, string, adapter.CreateOptions) (adapter.Handle, error) {
	return adapter.Handle{}, f.call("Fork")
}
func (f full) SetNetworkPolicy(context.Context, adapter.Handle, adapter.NetworkPolicy) error {
	return f.call("SetNetworkPolicy")
}
func (f full) PublicURL(context.Context, adapter.Handle, int) (string, error) {
	return "", f.call("PublicURL")
}

// declaring is full that declares a capability set at run time.
type declaring struct {
	full
	caps adapter.Capabilities
}

func (d declaring) Capabilities() adapter.Capabilities { return d.caps }

// suspendOnly implements one optional interface and declares everything.
type suspendOnly struct{ *model }

func (s suspendOnly) Suspend(context.Context, adapter.Handle) error { return s.call("Suspend") }
func (s suspendOnly) Resume(context.Context, adapter.Handle) error  { return s.call("Resume") }
func (s suspendOnly) Capabilities() adapter.Capabilities            { return adapter.AllCapabilities() }

// TestCapabilitiesFromInterfaces: a capability is advertised when the
// driver implements its interface (and, for a Declarer, declares it);
// declared without the method it is never advertised.
func TestCapabilitiesFromInterfaces(t *testing.T) {
	tests := []struct {
		name string
		d    adapter.Driver
		want adapter.Capabilities
	}{
		{"core only", newModel(), nil},
		{"every interface", full{newModel()}, adapter.AllCapabilities()},
		{"declared subset", declaring{full{newModel()}, adapter.Capabilities{adapter.CapTTY, adapter.CapAttach}},
			adapter.Capabilities{adapter.CapAttach, adapter.CapTTY}},
		{"declared without the method", suspendOnly{newModel()}, adapter.Capabilities{adapter.CapSuspend}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := adapter.New(tc.d, adapter.Options{}).Capabilities(); !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// TestChecksBeforeTheDriver: every bad argument and every call behind a
// capability that is not advertised is refused with its kind, and the
// driver is never reached. A handle's name goes into provider URLs and
// paths, so a name like "../x" must never reach a driver.
func TestChecksBeforeTheDriver(t *testing.T) {
	ctx := context.Background()
	h := adapter.Handle{Provider: "model", Name: "box", ID: "id-1"}
	ok := adapter.Command{Path: "true"}
	zero := &adapter.TTYSize{}
	type call func(a adapter.Adapter) error
	tests := []struct {
		name string
		caps adapter.Capabilities // declared; every interface is implemented
		fn   call
		want error
	}{
		{"create bad name", nil, func(a adapter.Adapter) error { _, err := a.Create(ctx, "Box_1", adapter.CreateOptions{}); return err }, adapter.ErrInvalid},
		{"get path name", nil, func(a adapter.Adapter) error { _, err := a.Get(ctx, "../x"); return err }, adapter.ErrInvalid},
		{"create policy unsupported", nil, func(a adapter.Adapter) error {
			_, err := a.Create(ctx, "box", adapter.CreateOptions{NetworkPolicy: &adapter.NetworkPolicy{}})
			return err
		}, adapter.ErrNotSupported},
		{"list negative page", nil, func(a adapter.Adapter) error { _, err := a.List(ctx, adapter.ListOptions{PageSize: -1}); return err }, adapter.ErrInvalid},
		{"destroy zero handle", nil, func(a adapter.Adapter) error { return a.Destroy(ctx, adapter.Handle{}) }, adapter.ErrInvalid},
		{"destroy path in handle", nil, func(a adapter.Adapter) error {
			return a.Destroy(ctx, adapter.Handle{Provider: "model", Name: "../../v1/sandboxes/other", ID: "id-1"})
		}, adapter.ErrInvalid},
		{"sessions other provider", nil, func(a adapter.Adapter) error {
			_, err := a.Sessions(ctx, adapter.Handle{Provider: "other", Name: "box", ID: "id-1"})
			return err
		}, adapter.ErrInvalid},
		{"exec empty command", nil, func(a adapter.Adapter) error { _, err := a.Exec(ctx, h, adapter.Command{}); return err }, adapter.ErrInvalid},
		{"spawn tty unsupported", nil, func(a adapter.Adapter) error {
			_, err := a.Spawn(ctx, h, ok, adapter.SpawnOptions{TTY: &adapter.TTYSize{Rows: 24, Cols: 80}})
			return err
		}, adapter.ErrNotSupported},
		{"spawn zero tty", adapter.Capabilities{adapter.CapTTY}, func(a adapter.Adapter) error {
			_, err := a.Spawn(ctx, h, ok, adapter.SpawnOptions{TTY: zero})
			return err
		}, adapter.ErrInvalid},
		{"attach unsupported", nil, func(a adapter.Adapter) error { _, err := a.Attach(ctx, h, "s", adapter.Cursor{}); return err }, adapter.ErrNotSupported},
		{"attach negative cursor", adapter.Capabilities{adapter.CapAttach}, func(a adapter.Adapter) error {
			_, err := a.Attach(ctx, h, "s", adapter.Cursor{Stderr: -1})
			return err
		}, adapter.ErrInvalid},
		{"resize zero", adapter.Capabilities{adapter.CapTTY}, func(a adapter.Adapter) error { return a.Resize(ctx, h, "s", adapter.TTYSize{Rows: 1}) }, adapter.ErrInvalid},
		{"terminate unsupported", nil, func(a adapter.Adapter) error { _, err := a.TerminateSession(ctx, h, "s", time.Second); return err }, adapter.ErrNotSupported},
		{"terminate grace", adapter.Capabilities{adapter.CapTerminateSession}, func(a adapter.Adapter) error {
			_, err := a.TerminateSession(ctx, h, "s", time.Minute)
			return err
		}, adapter.ErrInvalid},
		{"suspend unsupported", nil, func(a adapter.Adapter) error { return a.Suspend(ctx, h) }, adapter.ErrNotSupported},
		{"resume unsupported", nil, func(a adapter.Adapter) error { return a.Resume(ctx, h) }, adapter.ErrNotSupported},
		{"checkpoint unsupported", nil, func(a adapter.Adapter) error { _, err := a.Checkpoint(ctx, h); return err }, adapter.ErrNotSupported},
		{"restore unsupported", nil, func(a adapter.Adapter) error { return a.Restore(ctx, h, "c") }, adapter.ErrNotSupported},
		{"policy unsupported", nil, func(a adapter.Adapter) error { return a.SetNetworkPolicy(ctx, h, adapter.NetworkPolicy{}) }, adapter.ErrNotSupported},
		{"url unsupported", nil, func(a adapter.Adapter) error { _, err := a.PublicURL(ctx, h, 8080); return err }, adapter.ErrNotSupported},
		{"url port", adapter.Capabilities{adapter.CapPublicURL}, func(a adapter.Adapter) error { _, err := a.PublicURL(ctx, h, 65536); return err }, adapter.ErrInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := newModel()
			a := adapter.New(declaring{full{m}, tc.caps}, adapter.Options{})
			err := tc.fn(a)
			if !errors.Is(err, tc.want) {
				t.Errorf("got %v, want %v", err, tc.want)
			}
			if r := m.reached(); len(r) != 0 {
				t.Errorf("the driver was reached: %v", r)
			}
		})
	}
}

// TestUnclassifiedErrorIsProvider: an error a driver returns outside the
// taxonomy comes back as *ProviderError still wrapping it; taxonomy and
// context errors pass unchanged.
func TestUnclassifiedErrorIsProvider(t *testing.T) {
	ctx := context.Background()
	boom := errors.New("boom")
	m := newModel()
	a := adapter.New(m, adapter.Options{})
	m.failWith("Get", boom, context.DeadlineExceeded, &adapter.DeniedError{Detail: "no"})

	_, err := a.Get(ctx, "box")
	var pe *adapter.ProviderError
	if !errors.As(err, &pe) || pe.Provider != "model" || !errors.Is(err, boom) || adapter.KindOf(err) != adapter.KindProvider {
		t.Errorf("unclassified: got %v (%T), want *ProviderError of model wrapping boom", err, err)
	}
	if _, err := a.Get(ctx, "box"); err != context.DeadlineExceeded {
		t.Errorf("context error: got %v, want it unchanged", err)
	}
	if _, err := a.Get(ctx, "box"); adapter.KindOf(err) != adapter.KindDenied || errors.Is(err, adapter.ErrProvider) {
		t.Errorf("denied: got %v, want denied unchanged", err)
	}
}

// TestRetryOnlyIdempotent: with a retry policy, a transient failure of an
// idempotent call is retried and the call succeeds; Exec, WriteStdin and
// a Spawn without a SessionID are made once; without a policy nothing is
// retried.
func TestRetryOnlyIdempotent(t *testing.T) {
	ctx := context.Background()
	h := adapter.Handle{Provider: "model", Name: "box", ID: "id-1"}
	unavailable := &adapter.UnavailableError{Detail: "blip"}
	retry := &adapter.Backoff{Base: time.Millisecond, Max: time.Millisecond, Attempts: 3}

	m := newModel()
	a := adapter.New(full{m}, adapter.Options{Retry: retry})
	m.failWith("Create", unavailable, unavailable)
	if _, err := a.Create(ctx, "box", adapter.CreateOptions{}); err != nil {
		t.Errorf("Create after two blips: %v", err)
	}
	m.failWith("Destroy", unavailable, unavailable, unavailable)
	if err := a.Destroy(ctx, h); !errors.Is(err, adapter.ErrUnavailable) {
		t.Errorf("Destroy after three blips: got %v, want unavailable", err)
	}
	m.failWith("Exec", unavailable)
	if _, err := a.Exec(ctx, h, adapter.Command{Path: "true"}); !errors.Is(err, adapter.ErrUnavailable) {
		t.Errorf("Exec: got %v, want unavailable", err)
	}
	m.failWith("WriteStdin", unavailable)
	if err := a.WriteStdin(ctx, h, "s", []byte("x")); !errors.Is(err, adapter.ErrUnavailable) {
		t.Errorf("WriteStdin: got %v, want unavailable", err)
	}
	m.failWith("Spawn", unavailable, unavailable)
	if _, err := a.Spawn(ctx, h, adapter.Command{Path: "true"}, adapter.SpawnOptions{}); !errors.Is(err, adapter.ErrUnavailable) {
		t.Errorf("Spawn without an id: got %v, want unavailable", err)
	}
	if _, err := a.Spawn(ctx, h, adapter.Command{Path: "true"}, adapter.SpawnOptions{SessionID: "s1"}); err != nil {
		t.Errorf("Spawn with an id after a blip: %v", err)
	}
	m.failWith("Get", adapter.ErrNotFound)
	if _, err := a.Get(ctx, "box"); !errors.Is(err, adapter.ErrNotFound) {
		t.Errorf("Get not found: got %v, want not found (definitive, not retried)", err)
	}
	want := map[string]int{"Create": 3, "Destroy": 3, "Exec": 1, "WriteStdin": 1, "Spawn": 3, "Get": 1}
	if got := m.reached(); !mapsEqual(got, want) {
		t.Errorf("calls: got %v, want %v", got, want)
	}

	once := newModel()
	b := adapter.New(once, adapter.Options{})
	once.failWith("Get", unavailable)
	if _, err := b.Get(ctx, "box"); !errors.Is(err, adapter.ErrUnavailable) || once.reached()["Get"] != 1 {
		t.Errorf("no policy: got %v after %d calls, want unavailable after 1", err, once.reached()["Get"])
	}
}

func mapsEqual(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
