package adapter

import (
	"slices"
	"sync"
)

// Registry maps provider names to adapters, so call sites never name an
// adapter type: creation-side code looks up a provider by name and
// everything else dispatches on the Provider a [Handle] carries. The host
// program registers the adapters it ships (and its own) at start-up.
// Which registered providers a deployment may use is the host's policy.
//
// A Registry is safe for concurrent use. The zero value is empty and ready.
type Registry struct {
	mu sync.RWMutex
	m  map[string]Adapter // guarded by mu; key is Adapter.Provider()
}

// Register adds a under a.Provider(). It returns *InvalidError when the
// name is empty or already registered.
func (r *Registry) Register(a Adapter) error {
	name := a.Provider()
	if name == "" {
		return &InvalidError{Detail: "adapter has an empty provider name"}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.m[name]; ok {
		return &InvalidError{Detail: "provider " + name + " is already registered"}
	}
	if r.m == nil {
		r.m = make(map[string]Adapter)
	}
	r.m[name] = a
	return nil
}

// Lookup returns the adapter registered as provider. An unknown provider is
// *InvalidError, never ErrNotFound: it says nothing about any sandbox.
func (r *Registry) Lookup(provider string) (Adapter, error) {
	r.mu.RLock()
	a, ok := r.m[provider]
	r.mu.RUnlock()
	if !ok {
		return nil, &InvalidError{Detail: "unknown provider " + provider}
	}
	return a, nil
}

// For returns the adapter that owns h, as Lookup(h.Provider).
func (r *Registry) For(h Handle) (Adapter, error) { return r.Lookup(h.Provider) }

// Providers returns the registered names, sorted.
func (r *Registry) Providers() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	names := make([]string, 0, len(r.m))
	for n := range r.m {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
