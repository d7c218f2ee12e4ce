package checkpoint

// Create: a checkpoint captured. The capture (capture.go) walks each tree
// from directory descriptors (never a path root could be led out by),
// splits files into content-addressed chunks and stores the ones not yet
// held, on every core.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"time"
)

// Options shape one checkpoint.
type Options struct {
	Comment string
	// Freeze, when set, stops the sandbox's processes; Create calls it
	// before walking the trees and the thaw it returns once every file's
	// content is captured (and always, on failure).
	Freeze func(ctx context.Context) (thaw func() error, err error)
	// ID, when set, is the new checkpoint's id (ck- and 16 lowercase
	// hex digits; one the store lists is ErrInvalid): a caller that made
	// something under that name first (a pool snapshot of the disk)
	// names the checkpoint after it. Empty: a random one.
	ID string
	// Frozen is recorded as the checkpoint's freeze when the trees were
	// frozen elsewhere (they are a snapshot taken under a freeze) and
	// Freeze is nil.
	Frozen time.Duration
}

// Create captures the trees rooted at roots (the sandbox's disk, in a
// fixed order) as a new checkpoint. On any failure (a full disk
// included: errors.Is(err, unix.ENOSPC)) nothing of it is kept.
func (s *Store) Create(ctx context.Context, roots []string, opt Options) (info Info, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var rnd [8]byte
	rand.Read(rnd[:])
	info = Info{ID: "ck-" + hex.EncodeToString(rnd[:]), Comment: opt.Comment, Created: time.Now().UTC(), Frozen: opt.Frozen}
	if opt.ID != "" {
		info.ID = opt.ID
	}

	ix, err := s.readIndex()
	if err != nil {
		return Info{}, err
	}
	if !idRE.MatchString(info.ID) || slices.ContainsFunc(ix.Checkpoints, func(c Info) bool { return c.ID == info.ID }) {
		return Info{}, fmt.Errorf("checkpoint id %q is malformed or taken: %w", info.ID, ErrInvalid)
	}
	var prev map[[2]string]entry // (root index, path) of the newest checkpoint
	if n := len(ix.Checkpoints); n > 0 {
		if sn, err := s.readSnapshot(ix.Checkpoints[n-1].ID); err == nil && len(sn.Trees) == len(roots) {
			prev = map[[2]string]entry{}
			for i, t := range sn.Trees {
				for _, e := range t {
					prev[[2]string{fmt.Sprint(i), e.Path}] = e
				}
			}
		}
	}
	if err := os.WriteFile(s.path("dirty"), nil, 0o600); err != nil {
		return Info{}, fmt.Errorf("create checkpoint: %w", err)
	}
	c := newCapture(ctx, s, prev, &info)
	defer func() {
		if err != nil {
			// Nothing half-written is kept: the chunks this attempt wrote
			// (none is named by an indexed checkpoint) and its snapshot.
			for _, p := range c.written {
				os.Remove(p)
			}
			os.Remove(s.path("snapshots", info.ID+".json.tmp"))
			os.Remove(s.path("snapshots", info.ID+".json"))
			os.Remove(s.path("dirty"))
			info = Info{}
		}
	}()

	sn := snapshot{Trees: make([][]entry, len(roots))}
	var thaw func() error
	var start time.Time
	if opt.Freeze != nil {
		if thaw, err = opt.Freeze(ctx); err != nil {
			c.stop()
			return Info{}, fmt.Errorf("freeze: %w", err)
		}
		start = time.Now()
	}
	// The freeze ends once every file's content is read (the chunkers are
	// done); hashing and compressing what they read needs no freeze.
	err = c.run(roots, sn.Trees, func() {
		if thaw != nil {
			info.Frozen = time.Since(start)
			if terr := thaw(); terr != nil {
				c.fail(fmt.Errorf("thaw: %w", terr))
			}
		}
	})
	if err != nil {
		return Info{}, err
	}
	info.Stored += c.stored
	crash("chunks")
	sn.Info = info
	b, err := json.Marshal(sn)
	if err != nil {
		return Info{}, err
	}
	if err := writeFileNoSync(s.path("snapshots", info.ID+".json"), b); err != nil {
		return Info{}, fmt.Errorf("write snapshot: %w", err)
	}
	info.Stored += int64(len(b))
	// One syncfs makes every chunk and the snapshot durable at once,
	// cheaper than an fsync per chunk.
	if err := syncfs(s.dir); err != nil {
		return Info{}, err
	}
	crash("snapshot")
	ix.Checkpoints = append(ix.Checkpoints, info)
	if err := s.writeIndex(ix); err != nil {
		return Info{}, err
	}
	crash("index")
	os.Remove(s.path("dirty"))
	return info, nil
}
