package registry

// Session records: keys under their sandbox, the start-order index
// written in the same transaction as each record (built at Open for an
// older registry), create, get, update, delete and paged listing.

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	bolt "go.etcd.io/bbolt"
)

func sessionPrefix(sandbox string) []byte { return []byte(sandbox + "\x00") }

// orderKey is a session's key in bucketSessionOrder.
func orderKey(sandbox string, at time.Time, id string) []byte {
	k := make([]byte, 0, len(sandbox)+1+8+len(id))
	k = append(k, sandbox...)
	k = append(k, 0)
	k = binary.BigEndian.AppendUint64(k, orderNanos(at))
	return append(k, id...)
}

// orderNanos is at as the index's unsigned nanoseconds; times before 1970
// (a zero time) sort first.
func orderNanos(at time.Time) uint64 {
	if at.Before(time.Unix(0, 0)) {
		return 0
	}
	return uint64(at.UnixNano())
}

// indexSessions (re)builds the start-order index when it does not hold
// exactly one entry per session record: a registry written by a runnerd
// that had no index (or an older one that wrote sessions without it). A
// record without CreatedAt gets its StartedAt, stored, so its place stays
// put from then on.
func indexSessions(tx *bolt.Tx) error {
	sessions, order := tx.Bucket(bucketSessions), tx.Bucket(bucketSessionOrder)
	if sessions.Stats().KeyN == order.Stats().KeyN {
		return nil
	}
	if err := tx.DeleteBucket(bucketSessionOrder); err != nil {
		return fmt.Errorf("drop session index: %w", err)
	}
	order, err := tx.CreateBucket(bucketSessionOrder)
	if err != nil {
		return fmt.Errorf("create session index: %w", err)
	}
	type fix struct {
		key []byte
		rec Session
	}
	var fixes []fix
	err = sessions.ForEach(func(k, v []byte) error {
		var s Session
		if err := json.Unmarshal(v, &s); err != nil {
			return fmt.Errorf("decode session %q: %w", k, err)
		}
		if s.CreatedAt.IsZero() {
			s.CreatedAt = s.StartedAt
			fixes = append(fixes, fix{bytes.Clone(k), s})
		}
		return order.Put(orderKey(s.Sandbox, s.CreatedAt, s.ID), nil)
	})
	if err != nil {
		return fmt.Errorf("index sessions: %w", err)
	}
	for _, f := range fixes {
		if err := put(sessions, f.key, f.rec); err != nil {
			return fmt.Errorf("index sessions: %w", err)
		}
	}
	return nil
}

func sessionKey(sandbox, id string) []byte { return []byte(sandbox + "\x00" + id) }

// CreateSession stores s if its sandbox exists, check (called with the
// sandbox record inside the transaction; nil accepts any) returns nil, and
// the id is free. It returns ErrNotFound when the sandbox is gone, check's
// error, or ErrExists with the stored record when the id is taken. The
// registry itself looks at neither the incarnation nor the state: check
// does.
func (r *Registry) CreateSession(s Session, check func(Sandbox) error) (Session, error) {
	var out Session
	err := r.db.Update(func(tx *bolt.Tx) error {
		sb, err := get[Sandbox](tx.Bucket(bucketSandboxes), []byte(s.Sandbox))
		if err != nil {
			return err
		}
		if check != nil {
			if err := check(sb); err != nil {
				return err
			}
		}
		b := tx.Bucket(bucketSessions)
		cur, err := get[Session](b, sessionKey(s.Sandbox, s.ID))
		if err == nil {
			out = cur
			return ErrExists
		}
		if !errors.Is(err, ErrNotFound) {
			return err
		}
		if s.CreatedAt.IsZero() {
			s.CreatedAt = s.StartedAt
		}
		out = s
		if err := tx.Bucket(bucketSessionOrder).Put(orderKey(s.Sandbox, s.CreatedAt, s.ID), nil); err != nil {
			return err
		}
		return put(b, sessionKey(s.Sandbox, s.ID), s)
	})
	return out, err
}

// GetSession returns one session, or ErrNotFound.
func (r *Registry) GetSession(sandbox, id string) (Session, error) {
	var out Session
	err := r.db.View(func(tx *bolt.Tx) error {
		var err error
		out, err = get[Session](tx.Bucket(bucketSessions), sessionKey(sandbox, id))
		return err
	})
	return out, err
}

// UpdateSession applies fn to the stored session and stores the result.
func (r *Registry) UpdateSession(sandbox, id string, fn func(*Session) error) (Session, error) {
	var out Session
	err := r.urgent(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketSessions)
		cur, err := get[Session](b, sessionKey(sandbox, id))
		if err != nil {
			return err
		}
		created := cur.CreatedAt
		if err := fn(&cur); err != nil {
			return err
		}
		cur.CreatedAt = created // the index key never moves
		out = cur
		return put(b, sessionKey(sandbox, id), cur)
	})
	return out, err
}

// UpdateSessions applies fn to the stored record of each session of
// sandbox named in ids and stores the results, all in one transaction (one
// fsync for any number of sessions). An id without a record is skipped.
func (r *Registry) UpdateSessions(sandbox string, ids []string, fn func(*Session)) error {
	return r.urgent(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketSessions)
		for _, id := range ids {
			cur, err := get[Session](b, sessionKey(sandbox, id))
			if errors.Is(err, ErrNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			created := cur.CreatedAt
			fn(&cur)
			cur.CreatedAt = created // the index key never moves
			if err := put(b, sessionKey(sandbox, id), cur); err != nil {
				return err
			}
		}
		return nil
	})
}

// DeleteSession removes one session record. Absent is not an error.
func (r *Registry) DeleteSession(sandbox, id string) error {
	return r.urgent(func(tx *bolt.Tx) error {
		cur, err := get[Session](tx.Bucket(bucketSessions), sessionKey(sandbox, id))
		if errors.Is(err, ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		return deleteSession(tx, cur)
	})
}

// deleteSession removes the record s and its index entry.
func deleteSession(tx *bolt.Tx, s Session) error {
	if err := tx.Bucket(bucketSessionOrder).Delete(orderKey(s.Sandbox, s.CreatedAt, s.ID)); err != nil {
		return err
	}
	return tx.Bucket(bucketSessions).Delete(sessionKey(s.Sandbox, s.ID))
}

// DeleteSessionIf removes one session record if check, called with the
// stored record inside the transaction, returns nil; otherwise it returns
// check's error and removes nothing. Absent is not an error (check is not
// called).
func (r *Registry) DeleteSessionIf(sandbox, id string, check func(Session) error) error {
	return r.urgent(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketSessions)
		cur, err := get[Session](b, sessionKey(sandbox, id))
		if errors.Is(err, ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := check(cur); err != nil {
			return err
		}
		return deleteSession(tx, cur)
	})
}

// ListSessions returns every session of sandbox, ordered by id.
func (r *Registry) ListSessions(sandbox string) ([]Session, error) {
	var out []Session
	err := r.db.View(func(tx *bolt.Tx) error {
		prefix := sessionPrefix(sandbox)
		c := tx.Bucket(bucketSessions).Cursor()
		for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
			var s Session
			if err := json.Unmarshal(v, &s); err != nil {
				return fmt.Errorf("decode session %q: %w", k, err)
			}
			out = append(out, s)
		}
		return nil
	})
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, err
}

// SessionCursor is a position in a sandbox's start-ordered session
// listing: the listing goes on after the session created at CreatedAt
// with id ID.
type SessionCursor struct {
	CreatedAt time.Time
	ID        string
}

// ListSessionsPage returns, in one transaction, the record of sandbox and
// up to limit of its sessions in start order (CreatedAt, then ID), from
// the first or after *after, and whether more follow. It reads only the
// registry: one index step and one record per session. ErrNotFound when
// the sandbox does not exist.
func (r *Registry) ListSessionsPage(sandbox string, after *SessionCursor, limit int) (Sandbox, []Session, bool, error) {
	var sb Sandbox
	var out []Session
	var more bool
	err := r.db.View(func(tx *bolt.Tx) error {
		var err error
		if sb, err = get[Sandbox](tx.Bucket(bucketSandboxes), []byte(sandbox)); err != nil {
			return err
		}
		prefix := sessionPrefix(sandbox)
		records := tx.Bucket(bucketSessions)
		c := tx.Bucket(bucketSessionOrder).Cursor()
		var k []byte
		if after == nil {
			k, _ = c.Seek(prefix)
		} else {
			from := orderKey(sandbox, after.CreatedAt, after.ID)
			if k, _ = c.Seek(from); k != nil && bytes.Equal(k, from) {
				k, _ = c.Next()
			}
		}
		for ; k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			if len(out) == limit {
				more = true
				return nil
			}
			if len(k) < len(prefix)+8 {
				return fmt.Errorf("session index key %q: too short", k)
			}
			id := string(k[len(prefix)+8:])
			s, err := get[Session](records, sessionKey(sandbox, id))
			if errors.Is(err, ErrNotFound) {
				// The index and the records change in one transaction:
				// a dangling entry is damage, not a session to skip
				// (and not the sandbox's ErrNotFound).
				return fmt.Errorf("session index names %q, which has no record", id)
			}
			if err != nil {
				return err
			}
			out = append(out, s)
		}
		return nil
	})
	if err != nil {
		return Sandbox{}, nil, false, err
	}
	return sb, out, more, nil
}

// AllSessions returns every session of every sandbox.
func (r *Registry) AllSessions() ([]Session, error) {
	var out []Session
	err := r.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSessions).ForEach(func(k, v []byte) error {
			var s Session
			if err := json.Unmarshal(v, &s); err != nil {
				return fmt.Errorf("decode session %q: %w", k, err)
			}
			out = append(out, s)
			return nil
		})
	})
	return out, err
}
