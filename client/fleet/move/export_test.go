package move

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/minio/minio-go/v7"
)

// Keys lists the keys under the store's prefix (the prefix cut), sorted:
// what a test finds left in the bucket.
func (s *Store) Keys(ctx context.Context, t testing.TB) []string {
	t.Helper()
	var out []string
	for obj := range s.mc.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: s.prefix, Recursive: true}) {
		if obj.Err != nil {
			t.Fatalf("list bucket: %v", obj.Err)
		}
		out = append(out, strings.TrimPrefix(obj.Key, s.prefix))
	}
	slices.Sort(out)
	return out
}
