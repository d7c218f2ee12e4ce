// Package registry is runnerd's durable record of sandboxes, sessions and
// preview tokens: one bbolt file (STATE/registry.db) that only runnerd opens.
//
// Invariants: a sandbox name maps to at most one record; its incarnation id
// is minted once, at the create that made the record, and never changes
// until the record is deleted. A session record belongs to exactly one
// sandbox record and is deleted with it. Every method is one bbolt
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
	// (shim.Spec.Isolate): set when it is created contained (or under
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
}

// Registry is the open registry file.
type Registry struct {
	db        *bolt.DB
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
		for _, b := range [][]byte{bucketSandboxes, bucketSessions, bucketIdentities} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
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
	err := r.db.Update(func(tx *bolt.Tx) error {
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
	return r.db.Update(func(tx *bolt.Tx) error {
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
		return nil
	})
}

func sessionPrefix(sandbox string) []byte { return []byte(sandbox + "\x00") }

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
		out = s
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
	err := r.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketSessions)
		cur, err := get[Session](b, sessionKey(sandbox, id))
		if err != nil {
			return err
		}
		if err := fn(&cur); err != nil {
			return err
		}
		out = cur
		return put(b, sessionKey(sandbox, id), cur)
	})
	return out, err
}

// DeleteSession removes one session record. Absent is not an error.
func (r *Registry) DeleteSession(sandbox, id string) error {
	return r.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSessions).Delete(sessionKey(sandbox, id))
	})
}

// DeleteSessionIf removes one session record if check, called with the
// stored record inside the transaction, returns nil; otherwise it returns
// check's error and removes nothing. Absent is not an error (check is not
// called).
func (r *Registry) DeleteSessionIf(sandbox, id string, check func(Session) error) error {
	return r.db.Update(func(tx *bolt.Tx) error {
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
		return b.Delete(sessionKey(sandbox, id))
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
	return r.db.Update(func(tx *bolt.Tx) error {
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
