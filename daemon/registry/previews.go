package registry

// Preview tokens: the record of each public preview URL's token.

import (
	"bytes"
	"encoding/json"

	bolt "go.etcd.io/bbolt"
)

// Preview is a preview token's record: the URL it names reaches Port of
// the sandbox incarnation it was minted for, and nothing else.
type Preview struct {
	Token       string `json:"token"`
	Sandbox     string `json:"sandbox"`
	Incarnation string `json:"incarnation"`
	Port        int    `json:"port"`
}

var bucketPreviews = []byte("previews")

// PutPreview returns the existing preview of (sandbox incarnation, port),
// or stores p.
func (r *Registry) PutPreview(p Preview) (Preview, error) {
	var out Preview
	err := r.db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketPreviews)
		if err != nil {
			return err
		}
		found := false
		err = b.ForEach(func(k, v []byte) error {
			var cur Preview
			if err := json.Unmarshal(v, &cur); err != nil {
				return err
			}
			if cur.Sandbox == p.Sandbox && cur.Incarnation == p.Incarnation && cur.Port == p.Port {
				out, found = cur, true
			}
			return nil
		})
		if err != nil || found {
			return err
		}
		out = p
		return put(b, []byte(p.Token), p)
	})
	return out, err
}

// GetPreview returns the preview of token, or ErrNotFound.
func (r *Registry) GetPreview(token string) (Preview, error) {
	var out Preview
	err := r.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketPreviews)
		if b == nil {
			return ErrNotFound
		}
		var err error
		out, err = get[Preview](b, []byte(token))
		return err
	})
	return out, err
}

// DeletePreviews removes every preview of sandbox.
func (r *Registry) DeletePreviews(sandbox string) error {
	return r.urgent(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketPreviews)
		if b == nil {
			return nil
		}
		var keys [][]byte
		err := b.ForEach(func(k, v []byte) error {
			var cur Preview
			if err := json.Unmarshal(v, &cur); err != nil {
				return err
			}
			if cur.Sandbox == sandbox {
				keys = append(keys, bytes.Clone(k))
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, k := range keys {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
}
