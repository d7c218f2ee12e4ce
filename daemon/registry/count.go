package registry

import (
	"bytes"

	bolt "go.etcd.io/bbolt"
)

// CountSessions returns how many session records sandbox holds, running or
// ended, from their keys alone (no record is decoded), for a bound on
// them that every spawn checks.
func (r *Registry) CountSessions(sandbox string) (int, error) {
	n := 0
	err := r.db.View(func(tx *bolt.Tx) error {
		prefix := sessionPrefix(sandbox)
		c := tx.Bucket(bucketSessions).Cursor()
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			n++
		}
		return nil
	})
	return n, err
}
