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
//
// Files: registry.go (Open, the record types, sandbox records),
// sessions.go (session records and their start-order index), previews.go
// (preview tokens), identity.go, reserve.go, count.go.
package registry

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
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
	// Pod says the sandbox lives in a pod (package pod): its commands
	// join the pod's namespaces, its Identity is the first id of its
	// subordinate block (uid 0 inside), and Pod names the running holder
	// (zero while none runs: suspended, or not made again yet).
	Pod *Pod `json:"pod,omitempty"`
}

// Pod is a pod sandbox's holder: its pid and start time (clock ticks
// since boot), which together name one process; zero when none runs.
type Pod struct {
	PID       int    `json:"pid,omitempty"`
	StartTime uint64 `json:"start_time,omitempty"`
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
