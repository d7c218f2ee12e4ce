package registry

// Identities: the unprivileged uid/gid pairs runnerd gives isolated
// sandboxes. The bucket "identities" maps a uid (4 bytes, big-endian) to
// the name of the sandbox holding it, plus one cursor key (keyNextID)
// naming where the next search starts. Allocation and release happen
// inside the transactions that create and delete the sandbox's record,
// so a uid is held exactly while its record exists: unique under
// concurrent creates (bbolt serializes writers), durable with the record
// (a kill -9 of runnerd loses neither or both), and free for another
// sandbox once the record is gone.

import (
	"encoding/binary"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// ErrNoIdentity is returned by CreateSandboxIdentity when every uid of the
// pool is held by a sandbox or taken by a user or group of the host.
var ErrNoIdentity = errors.New("no free identity")

var (
	bucketIdentities = []byte("identities")
	// keyNextID is the uid the next search starts at. It is not 4 bytes
	// long, so it never reads as a uid.
	keyNextID = []byte("next-uid")
)

// Identity is a uid/gid pair a sandbox's commands run as. GID equals UID,
// as systemd's dynamic users do: one number, one owner.
type Identity struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
}

// IdentityPool is where identities come from.
type IdentityPool struct {
	// First and Last bound the uids (inclusive).
	First, Last uint32
	// Taken, when not nil, reports a uid (as uid, and as gid) the host
	// already uses, e.g. one that resolves through NSS; it is skipped. It
	// is called inside the registry's write transaction, so keep it fast.
	Taken func(id uint32) bool
	// Step, when above 1, hands out blocks: only First, First+Step, ...
	// are allocated (a pod's subordinate block of Step ids, held by its
	// first id); Last is the last id of the last block.
	Step uint32
}

// allocIdentity takes the first free uid of pool at or after the cursor,
// wrapping around, and records it as held by name. Searching from a
// cursor, not from First, delays the reuse of a freed uid as long as the
// pool allows: files a destroyed sandbox left outside its workspace (in
// a shared /tmp) stay owned by a uid nobody holds for as long as possible.
func allocIdentity(tx *bolt.Tx, pool IdentityPool, name string) (Identity, error) {
	if pool.Last < pool.First {
		return Identity{}, fmt.Errorf("allocate identity: empty pool %d-%d", pool.First, pool.Last)
	}
	b := tx.Bucket(bucketIdentities)
	start := pool.First
	if raw := b.Get(keyNextID); len(raw) == 4 {
		if n := binary.BigEndian.Uint32(raw); n >= pool.First && n <= pool.Last {
			start = n
		}
	}
	step := uint64(max(pool.Step, 1))
	size := (uint64(pool.Last) - uint64(pool.First) + 1) / step
	if size == 0 {
		return Identity{}, fmt.Errorf("allocate identity: pool %d-%d holds no block of %d", pool.First, pool.Last, step)
	}
	first := (uint64(start-pool.First) / step) % size // a cursor inside a block starts at its block
	for i := uint64(0); i < size; i++ {
		uid := uint32(uint64(pool.First) + ((first+i)%size)*step)
		key := uidKey(uid)
		if b.Get(key) != nil {
			continue
		}
		if pool.Taken != nil && pool.Taken(uid) {
			continue
		}
		if err := b.Put(key, []byte(name)); err != nil {
			return Identity{}, err
		}
		next := uint32(uint64(uid) + step)
		if uint64(uid)+step > uint64(pool.Last) {
			next = pool.First
		}
		if err := b.Put(keyNextID, uidKey(next)); err != nil {
			return Identity{}, err
		}
		return Identity{UID: uid, GID: uid}, nil
	}
	return Identity{}, fmt.Errorf("allocate identity from %d-%d: %w", pool.First, pool.Last, ErrNoIdentity)
}

// freeIdentity releases the identity of sandbox name's record, if it has
// one and holds it.
func freeIdentity(tx *bolt.Tx, name string) error {
	sb, err := get[Sandbox](tx.Bucket(bucketSandboxes), []byte(name))
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if sb.Identity == nil {
		return nil
	}
	b := tx.Bucket(bucketIdentities)
	key := uidKey(sb.Identity.UID)
	if string(b.Get(key)) != name {
		return nil // not held by this record (never the case; never free another's)
	}
	return b.Delete(key)
}

func uidKey(uid uint32) []byte {
	return binary.BigEndian.AppendUint32(nil, uid)
}

// Identities returns every held uid and the sandbox holding it.
func (r *Registry) Identities() (map[uint32]string, error) {
	out := map[uint32]string{}
	err := r.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketIdentities).ForEach(func(k, v []byte) error {
			if len(k) == 4 {
				out[binary.BigEndian.Uint32(k)] = string(v)
			}
			return nil
		})
	})
	return out, err
}
