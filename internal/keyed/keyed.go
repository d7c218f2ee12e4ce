// Package keyed holds Mutex, a set of mutexes by key (a sandbox's name, a
// netpolicy id), made on demand and dropped when no caller holds or waits
// for them, so its size is the keys in use, not every key ever seen.
package keyed

import "sync"

// Mutex is a set of mutexes by key. The zero value is ready to use.
type Mutex struct {
	mu sync.Mutex // guards m and every entry's refs
	m  map[string]*entry
}

type entry struct {
	mu   sync.Mutex
	refs int
}

// Lock locks key and returns its unlock function.
func (k *Mutex) Lock(key string) (unlock func()) {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*entry{}
	}
	e := k.m[key]
	if e == nil {
		e = &entry{}
		k.m[key] = e
	}
	e.refs++
	k.mu.Unlock()
	e.mu.Lock()
	return func() {
		e.mu.Unlock()
		k.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
}

// Len is the number of keys held or waited for.
func (k *Mutex) Len() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.m)
}
