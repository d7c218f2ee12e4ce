// Package registry is runnerd's durable record of sandboxes, sessions and
// preview tokens: one bbolt file (STATE/registry.db) that only runnerd opens.
//
// Invariants: a sandbox name maps to at most one record; its incarnation id
// is minted once, at the create that made the record, and never changes
// until the record is deleted. A session record belongs to exactly one
// sandbox record and is deleted with it. Every session record has exactly
// one entry in the start-order index (sandbox, CreatedAt, id), written and
// deleted in the same transaction as the record; CreatedAt never changes,
// so a session's place in a listing never moves between pages. A registry
// written before the index existed gets it built at Open. Every method is one bbolt
// transaction, so concurrent callers serialize on the database: two creates
// of one name see each other.
//
// An identity (the uid/gid an isolated sandbox's commands run as, see
// identity.go) is taken in the transaction that creates its sandbox's
// record and released in the one that deletes it, so no identity is ever
// held without a record nor shared by two records.
//
// A Registry is safe for concurrent use. Close it once; Close is idempotent.
package registry

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/agentrunner/runner/wire"
)

// ErrNotFound is returned when the registry definitively has no such record.
var ErrNotFound = errors.New("not found")

// ErrExists is returned by CreateSession when the session id is taken.
var ErrExists = errors.New("already exists")

var (
	bucketSandboxes = []byte("sandboxes")
	bucketSessions  = []byte("sessions")
	// bucketSessionOrder indexes sessions by start: key sandbox NUL
	// CreatedAt (8 bytes, big-endian Unix nanoseconds) id, empty value.
	bucketSessionOrder = []byte("sessions_by_start")
)

// Sandbox is the registry's record of one sandbox.
type Sandbox struct {
	Name        string        `json:"name"`
	Incarnation string        `json:"incarnation"`
	State       string        `json:"state"`
	CreatedAt   time.Time     `json:"created_at"`
	ParkedAt    *time.Time    `json:"parked_at,omitempty"`
	Workspace   string        `json:"workspace"`
	User        string        `json:"user,omitempty"`
	Network     *wire.Network `json:"network,omitempty"`
	// Identity is the uid/gid allocated to the sandbox (CreateSandboxIdentity);
	// nil when its commands run as User or as runnerd's own user.
	Identity *Identity `json:"identity,omitempty"`
	// Isolated says its commands run with no way back to privilege
	// (sessiondir.Spec.Isolate): set when it is created contained (or under
	// --isolate all) or a policy is added to it; never cleared.
	Isolated bool `json:"isolated,omitempty"`
	// Limits are the sandbox's resource limits (the host's defaults
	// filled in); nil: none. The cgroup is converged to them.
	Limits *wire.Limits `json:"limits,omitempty"`
}

// Session is the registry's record of one session.
type Session struct {
	Sandbox     string             `json:"sandbox"`
	ID          string             `json:"id"`
	Incarnation string             `json:"incarnation"` // of the sandbox it belongs to
	Key         string             `json:"key"`         // session directory name under STATE/s
	Request     wire.CreateSession `json:"request"`     // what was asked, for retry comparison
	State       string             `json:"state"`       // starting (runnerd's own), running, exited, lost
	PID         int                `json:"pid,omitempty"`
	StartedAt   time.Time          `json:"started_at"`
	Exit        *wire.Exit         `json:"exit,omitempty"`
	// CreatedAt is when runnerd recorded the spawn: the listing order
	// key. CreateSession sets it (StartedAt when zero); it never changes
	// afterwards, while StartedAt may move to the shim's own start time.
	CreatedAt time.Time `json:"created_at,omitempty"`
}

// Registry is the open registry file.
type Registry struct {
	db        *bolt.DB
	res       reserve // reserve.go
	closeOnce sync.Once
	closeErr  error
}

// Open opens (creating if needed) the registry at path. It fails at once
// if another process holds the file.
func Open(path string) (*Registry, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 500 * time.Millisecond})
	if err != nil {
		return nil, fmt.Errorf("open registry %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketSandboxes, bucketSessions, bucketSessionOrder, bucketIdentities} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return indexSessions(tx)
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("init registry %s: %w", path, err)
	}
	return &Registry{db: db}, nil
}

// Close closes the file. It is idempotent.
func (r *Registry) Close() error {
	r.closeOnce.Do(func() { r.closeErr = r.db.Close() })
	return r.closeErr
}

// NewID returns a random 16-hex-digit id.
func NewID() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return hex.EncodeToString(b[:])
}

func get[T any](b *bolt.Bucket, key []byte) (T, error) {
	var v T
	raw := b.Get(key)
	if raw == nil {
		return v, ErrNotFound
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return v, fmt.Errorf("decode record %q: %w", key, err)
	}
	return v, nil
}

func put(b *bolt.Bucket, key []byte, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return b.Put(key, raw)
}

// CreateSandbox stores sb unless a sandbox of that name exists. It returns
// the stored record and whether this call created it. A new record gets a
// fresh incarnation id.
func (r *Registry) CreateSandbox(sb Sandbox) (Sandbox, bool, error) {
	return r.CreateSandboxIdentity(sb, nil)
}

// CreateSandboxIdentity is CreateSandbox that, when pool is not nil and
// the record is new, also allocates the record an identity from pool in
// the same transaction (ErrNoIdentity when none is free; nothing is
// stored then). An existing record is returned as it is.
func (r *Registry) CreateSandboxIdentity(sb Sandbox, pool *IdentityPool) (Sandbox, bool, error) {
	var out Sandbox
	var created bool
	err := r.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketSandboxes)
		cur, err := get[Sandbox](b, []byte(sb.Name))
		if err == nil {
			out = cur
			return nil
		}
		if !errors.Is(err, ErrNotFound) {
			return err
		}
		sb.Identity = nil
		if pool != nil {
			id, err := allocIdentity(tx, *pool, sb.Name)
			if err != nil {
				return err
			}
			sb.Identity = &id
		}
		sb.Incarnation = NewID()
		out, created = sb, true
		return put(b, []byte(sb.Name), sb)
	})
	return out, created, err
}

// GetSandbox returns the sandbox named name, or ErrNotFound.
func (r *Registry) GetSandbox(name string) (Sandbox, error) {
	var out Sandbox
	err := r.db.View(func(tx *bolt.Tx) error {
		var err error
		out, err = get[Sandbox](tx.Bucket(bucketSandboxes), []byte(name))
		return err
	})
	return out, err
}

// UpdateSandbox applies fn to the stored record of name and stores the
// result, in one transaction. It returns ErrNotFound when there is none, or
// fn's error (nothing is stored then).
func (r *Registry) UpdateSandbox(name string, fn func(*Sandbox) error) (Sandbox, error) {
	var out Sandbox
	err := r.urgent(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketSandboxes)
		cur, err := get[Sandbox](b, []byte(name))
		if err != nil {
			return err
		}
		if err := fn(&cur); err != nil {
			return err
		}
		out = cur
		return put(b, []byte(name), cur)
	})
	return out, err
}

// ListSandboxes returns up to limit sandboxes with names greater than
// after, ordered by name, and whether more follow.
func (r *Registry) ListSandboxes(after string, limit int) ([]Sandbox, bool, error) {
	var out []Sandbox
	var more bool
	err := r.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketSandboxes).Cursor()
		k, v := c.Seek([]byte(after))
		if k != nil && after != "" && string(k) == after {
			k, v = c.Next()
		}
		for ; k != nil; k, v = c.Next() {
			if len(out) == limit {
				more = true
				return nil
			}
			var sb Sandbox
			if err := json.Unmarshal(v, &sb); err != nil {
				return fmt.Errorf("decode sandbox %q: %w", k, err)
			}
			out = append(out, sb)
		}
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	return out, more, nil
}

// CountSandboxes returns how many sandboxes exist.
func (r *Registry) CountSandboxes() (int, error) {
	var n int
	err := r.db.View(func(tx *bolt.Tx) error {
		n = tx.Bucket(bucketSandboxes).Stats().KeyN
		return nil
	})
	return n, err
}

// DeleteSandbox removes the sandbox and all its session records, and
// frees its identity. Absent is not an error.
func (r *Registry) DeleteSandbox(name string) error {
	return r.urgent(func(tx *bolt.Tx) error {
		if err := freeIdentity(tx, name); err != nil {
			return err
		}
		if err := tx.Bucket(bucketSandboxes).Delete([]byte(name)); err != nil {
			return err
		}
		b := tx.Bucket(bucketSessions)
		prefix := sessionPrefix(name)
		c := b.Cursor()
		var keys [][]byte
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			keys = append(keys, bytes.Clone(k))
		}
		for _, k := range keys {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		return deletePrefix(tx.Bucket(bucketSessionOrder), prefix)
	})
}

// deletePrefix deletes every key of b that starts with prefix.
func deletePrefix(b *bolt.Bucket, prefix []byte) error {
	var keys [][]byte
	c := b.Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		keys = append(keys, bytes.Clone(k))
	}
	for _, k := range keys {
		if err := b.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

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
