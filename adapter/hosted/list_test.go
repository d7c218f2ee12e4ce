package hosted_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/hosted"
)

// pages is a listing: token → (items, next token, error).
type pages map[string]struct {
	items []int
	next  string
	err   error
}

func (p pages) page(_ context.Context, token string) ([]int, string, error) {
	pg := p[token]
	return pg.items, pg.next, pg.err
}

func TestListAll(t *testing.T) {
	ctx := context.Background()
	whole := pages{"": {[]int{1, 2}, "b", nil}, "b": {[]int{3}, "c", nil}, "c": {nil, "", nil}}
	if got, err := hosted.ListAll(ctx, "list", "", whole.page); err != nil || !slices.Equal(got, []int{1, 2, 3}) {
		t.Fatalf("whole listing: got %v, %v; want [1 2 3]", got, err)
	}
	if got, err := hosted.ListAll(ctx, "list", "b", whole.page); err != nil || !slices.Equal(got, []int{3}) {
		t.Fatalf("from token b: got %v, %v; want [3]", got, err)
	}
	cut := pages{"": {[]int{1}, "b", nil}, "b": {nil, "", &adapter.UnavailableError{Detail: "cut"}}}
	if got, err := hosted.ListAll(ctx, "list", "", cut.page); got != nil || !errors.Is(err, adapter.ErrUnavailable) {
		t.Fatalf("a page cut: got %v, %v; want no items, unavailable", got, err)
	}
	loop := pages{"": {[]int{1}, "b", nil}, "b": {[]int{2}, "b", nil}}
	if got, err := hosted.ListAll(ctx, "list", "", loop.page); got != nil || !errors.Is(err, adapter.ErrUnavailable) {
		t.Fatalf("a repeated cursor: got %v, %v; want no items, unavailable", got, err)
	}
}
