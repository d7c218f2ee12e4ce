package adapter

import (
	"context"
	"errors"
	"slices"
	"testing"
)

// named is the smallest Adapter: enough for the registry, refusing the rest.
type named struct {
	Adapter
	name string
}

func (n named) Provider() string { return n.name }

func TestRegistry(t *testing.T) {
	var r Registry
	if err := r.Register(named{name: "a"}); err != nil {
		t.Fatal(err)
	}
	if err := r.Register(named{name: "b"}); err != nil {
		t.Fatal(err)
	}
	if err := r.Register(named{name: "a"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("duplicate Register = %v, want invalid", err)
	}
	if err := r.Register(named{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("empty Register = %v, want invalid", err)
	}
	a, err := r.For(Handle{Provider: "b", Name: "x"})
	if err != nil || a.Provider() != "b" {
		t.Errorf("For(b) = %v, %v; want adapter b", a, err)
	}
	_, err = r.Lookup("nope")
	if !errors.Is(err, ErrInvalid) || errors.Is(err, ErrNotFound) {
		t.Errorf("Lookup(unknown) = %v, want invalid and never not_found", err)
	}
	if got := r.Providers(); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("Providers = %v, want [a b]", got)
	}
}

// pager lists names in pages of two, and fails at page fail (1-based; 0 never).
type pager struct {
	named
	names []string
	fail  int
}

func (p *pager) List(_ context.Context, o ListOptions) (Page, error) {
	i := 0
	if o.PageToken != "" {
		i = int(o.PageToken[0] - '0')
	}
	if p.fail > 0 && i/2+1 == p.fail {
		return Page{}, &UnavailableError{Detail: "cut"}
	}
	end := min(i+2, len(p.names))
	var pg Page
	for _, n := range p.names[i:end] {
		pg.Handles = append(pg.Handles, Handle{Provider: "p", Name: n})
	}
	if end < len(p.names) {
		pg.NextPageToken = string(rune('0' + end))
	}
	return pg, nil
}

func TestListAll(t *testing.T) {
	names := []string{"a", "b", "c", "d", "e"}
	hs, err := ListAll(context.Background(), &pager{named: named{name: "p"}, names: names}, 2, 0)
	if err != nil || len(hs) != 5 {
		t.Fatalf("ListAll = %d handles, %v; want 5, nil", len(hs), err)
	}
	hs, err = ListAll(context.Background(), &pager{named: named{name: "p"}, names: names, fail: 2}, 2, 0)
	if !errors.Is(err, ErrUnavailable) || hs != nil {
		t.Errorf("interrupted ListAll = %d handles, %v; want none and unavailable", len(hs), err)
	}
	_, err = ListAll(context.Background(), &pager{named: named{name: "p"}, names: names}, 2, 2)
	if !errors.Is(err, ErrProvider) {
		t.Errorf("endless ListAll = %v, want provider error", err)
	}
}
