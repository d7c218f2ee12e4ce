package hosted

import (
	"context"
	"fmt"

	"github.com/agentrunner/runner/adapter"
)

// ListAll follows a provider's list cursor from token to the end, for the
// providers' API clients: page returns one page's items and the next
// cursor ("" ends the listing). An error on any page fails the whole
// listing, and so does a cursor that repeats (it would page forever):
// never a partial set.
func ListAll[T any](ctx context.Context, op, token string, page func(ctx context.Context, token string) ([]T, string, error)) ([]T, error) {
	var all []T
	seen := map[string]bool{}
	for {
		items, next, err := page(ctx, token)
		if err != nil {
			return nil, err
		}
		all = append(all, items...)
		if next == "" {
			return all, nil
		}
		if seen[next] {
			return nil, fmt.Errorf("%s: %w", op, &adapter.UnavailableError{Detail: "the list cursor repeated"})
		}
		seen[next] = true
		token = next
	}
}
