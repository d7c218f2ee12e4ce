// Package move moves a parked sandbox from one runnerd of a fleet to
// another through an S3-compatible bucket, and drains a runner of its
// parked sandboxes (docs/operations.md, "Moving a parked sandbox").
//
// A move, with runnerd's own API only:
//
//  1. take the sandbox's lease in the bucket (lease.go): one mover at a
//     time, across processes and hosts;
//  2. on the source runner: refuse if a session runs, park (suspend),
//     checkpoint, and stream the checkpoint archive and the session
//     archive into the bucket, then a manifest that says both are whole;
//  3. on the target runner: create the sandbox under the same name and
//     options, import and restore the checkpoint, import the sessions
//     (same ids, exits, journals from byte 0); it stays parked;
//  4. record the route (PREFIX/routes/NAME, and the pool's SetRoute), then
//     destroy the source's copy, release the lease, remove the archive.
//
// Invariants:
//   - Never live on two hosts: the source copy is parked before the target
//     copy exists, the pool answers the name unavailable while it moves
//     (fleet.Pool.Moving), and the source copy is destroyed once the
//     route names the target (the bucket's route record is read under
//     the lease, so a move by another process is seen). A failure before
//     the route is written destroys the target's copy and leaves the
//     source parked.
//   - Credentials never print (Credentials' String/Format) and never reach
//     an error or a log line.
//
// Archive and Restore split a move in two: the sandbox is archived (parked,
// in the bucket, removed from its runner; its route names no runner and
// the pool answers it unavailable) and later restored on any runner of
// the fleet, under the same lease and route rules.
//
// Files: bucket.go (the Store: credentials, objects, error mapping),
// lease.go (the lease), move.go (Mover and Move), archive.go (Archive,
// Restore), drain.go (Drain, routes).
package move

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/client/fleet"
	"github.com/agentrunner/runner/wire"
)

// DefaultLeaseTTL is Options.LeaseTTL when 0: far above the time a move
// of a large sandbox takes, since an expired lease may be taken over.
const DefaultLeaseTTL = 30 * time.Minute

// Options tune a Mover. The zero value is usable.
type Options struct {
	// Holder names this mover in its leases; "" is host name and pid.
	Holder string
	// LeaseTTL is how long a lease holds when its mover dies mid-move.
	LeaseTTL time.Duration
	// KeepArchive keeps the archive objects in the bucket after a move
	// (a copy of the parked sandbox as it left); by default they are
	// removed once the target holds it.
	KeepArchive bool
	// Logger receives the steps of each move; nil discards them.
	Logger *slog.Logger
}

// Mover moves parked sandboxes of a pool through a bucket. It is safe for
// concurrent use; moves of different sandboxes run independently.
type Mover struct {
	pool  *fleet.Pool
	store *Store
	opts  Options
	log   *slog.Logger
}

// New returns a mover over pool and store; neither is closed by it.
func New(pool *fleet.Pool, store *Store, opts Options) *Mover {
	if opts.Holder == "" {
		host, _ := os.Hostname()
		opts.Holder = host + "-" + strconv.Itoa(os.Getpid())
	}
	if opts.LeaseTTL <= 0 {
		opts.LeaseTTL = DefaultLeaseTTL
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Mover{pool: pool, store: store, opts: opts, log: log}
}

// ManifestVersion is the version of the manifest a Mover writes.
const ManifestVersion = 1

// Manifest describes one archived sandbox: PREFIX/sandboxes/NAME/
// manifest.json, written after its two archives, so its presence says
// both are whole.
type Manifest struct {
	Version         int                `json:"version"`
	Sandbox         string             `json:"sandbox"`
	From            string             `json:"from"`
	Create          wire.CreateSandbox `json:"create"`
	Checkpoint      string             `json:"checkpoint"`
	CheckpointBytes int64              `json:"checkpoint_bytes"`
	SessionsBytes   int64              `json:"sessions_bytes"`
	Archived        time.Time          `json:"archived"`
}

// Route records where a moved sandbox lives: PREFIX/routes/NAME. Runner
// "" says it is archived, on no runner (Archive, Restore).
type Route struct {
	Sandbox string    `json:"sandbox"`
	Runner  string    `json:"runner"`
	Moved   time.Time `json:"moved"`
}

func (m *Mover) objKey(name, obj string) string { return m.store.key("sandboxes", name, obj) }

// Move moves parked (or parkable) sandbox name from the runner that holds
// it to runner to ("" lets placement pick one other than the source),
// and returns the target. A session still running is a conflict
// (*adapter.InvalidError) and changes nothing; another mover's lease is a
// *LeaseHeldError. The sandbox arrives parked (suspended): resume it to
// run commands in it.
func (m *Mover) Move(ctx context.Context, name, to string) (string, error) {
	// The bucket's route is the truth of where a moved sandbox lives (a
	// move by another process, or one this pool has not loaded).
	if err := m.syncRoute(ctx, name); err != nil {
		return "", fmt.Errorf("move %s: %w", name, err)
	}
	from, ok := m.pool.RunnerOf(name)
	if !ok {
		return "", &adapter.InvalidError{Detail: fmt.Sprintf("move: sandbox name %q carries no route of this fleet", name)}
	}
	if from == "" {
		return "", &adapter.InvalidError{Detail: fmt.Sprintf("move: sandbox %s is archived, on no runner: Restore it", name)}
	}
	if to == "" {
		var err error
		if to, err = m.pool.Pick(ctx, from); err != nil {
			return "", fmt.Errorf("move %s: pick a runner: %w", name, err)
		}
	}
	if to == from {
		return "", &adapter.InvalidError{Detail: fmt.Sprintf("move: sandbox %s is on %s already", name, to)}
	}
	src, err := m.pool.Client(from)
	if err != nil {
		return "", fmt.Errorf("move %s: %w", name, err)
	}
	dst, err := m.pool.Client(to)
	if err != nil {
		return "", fmt.Errorf("move %s: %w", name, err)
	}
	lease, err := m.store.Acquire(ctx, Lease{Sandbox: name, Holder: m.opts.Holder, From: from, To: to}, m.opts.LeaseTTL)
	if err != nil {
		return "", fmt.Errorf("move %s: take lease: %w", name, err)
	}
	// Released on every path: a failed move leaves the source as the
	// sandbox's one copy, and the next mover may start at once.
	defer func() {
		if err := m.store.Release(context.WithoutCancel(ctx), lease); err != nil {
			m.log.Warn("move: release lease", "sandbox", name, "err", err)
		}
	}()
	// Under the lease no other mover writes the route: read it again, so
	// a move that finished between the first read and the lease is seen.
	if err := m.syncRoute(ctx, name); err != nil {
		return "", fmt.Errorf("move %s: %w", name, err)
	}
	if now, _ := m.pool.RunnerOf(name); now != from {
		return "", &adapter.InvalidError{Detail: fmt.Sprintf("move: sandbox %s moved to %s meanwhile", name, now)}
	}
	done, err := m.pool.Moving(name)
	if err != nil {
		return "", fmt.Errorf("move %s: %w", name, err)
	}
	defer done()
	// A target that has the name already is refused before the source is
	// touched (restore checks again, under the same lease).
	if _, err := dst.GetSandbox(ctx, name); err == nil {
		return "", &adapter.InvalidError{Detail: fmt.Sprintf("move: runner %s holds a sandbox %s already", to, name)}
	} else if !errors.Is(err, adapter.ErrNotFound) {
		return "", fmt.Errorf("move %s: look on %s: %w", name, to, err)
	}
	start := time.Now()
	man, err := m.archive(ctx, src, from, name)
	if err != nil {
		m.removeArchive(ctx, name)
		return "", fmt.Errorf("move %s from %s: %w", name, from, err)
	}
	moved := false
	defer func() {
		if !moved || !m.opts.KeepArchive {
			m.removeArchive(ctx, name)
		}
	}()
	m.log.Info("move: archived", "sandbox", name, "from", from, "checkpoint_bytes", man.CheckpointBytes, "sessions_bytes", man.SessionsBytes, "took", time.Since(start))
	if err := m.restore(ctx, dst, man); err != nil {
		if errors.Is(err, errTargetHolds) {
			return "", &adapter.InvalidError{Detail: fmt.Sprintf("move: runner %s holds a sandbox %s already; the source's stays parked", to, name)}
		}
		// The target's copy goes; the source stays parked, the one copy.
		if derr := dst.DeleteSandbox(context.WithoutCancel(ctx), name); derr != nil {
			m.log.Warn("move: remove the target's partial copy", "sandbox", name, "to", to, "err", derr)
		}
		return "", fmt.Errorf("move %s to %s: %w", name, to, err)
	}
	// From here the target is the sandbox: its route first, then the
	// source's copy goes.
	if _, err := m.store.putJSON(ctx, m.store.key("routes", name), Route{Sandbox: name, Runner: to, Moved: time.Now().UTC()}, minio.PutObjectOptions{}); err != nil {
		if derr := dst.DeleteSandbox(context.WithoutCancel(ctx), name); derr != nil {
			m.log.Warn("move: remove the target's copy", "sandbox", name, "to", to, "err", derr)
		}
		return "", fmt.Errorf("move %s: record route: %w", name, err)
	}
	m.pool.SetRoute(name, to)
	moved = true // the target holds it: the archive is a copy now
	if err := src.DeleteSandbox(ctx, name); err != nil {
		// The route names the target; Drain of the source removes the
		// copy left there (its route names another runner).
		return to, fmt.Errorf("move %s: moved to %s, but removing the copy on %s failed: %w", name, to, from, err)
	}
	m.log.Info("move: done", "sandbox", name, "from", from, "to", to, "took", time.Since(start))
	return to, nil
}

// archive parks name on src, checkpoints it and uploads its checkpoint
// archive, session archive and manifest.
func (m *Mover) archive(ctx context.Context, src *client.Client, from, name string) (Manifest, error) {
	sb, err := src.GetSandbox(ctx, name)
	if err != nil {
		return Manifest{}, err
	}
	sess, err := src.Sessions(ctx, name)
	if err != nil {
		return Manifest{}, err
	}
	for _, s := range sess {
		if s.State == wire.SessionRunning {
			return Manifest{}, &adapter.InvalidError{Detail: fmt.Sprintf("session %s of sandbox %s is running: a sandbox moves with its sessions ended", s.ID, name)}
		}
	}
	if sb.State != wire.SandboxSuspended {
		if sb, err = src.Suspend(ctx, name); err != nil {
			return Manifest{}, fmt.Errorf("park: %w", err)
		}
	}
	ck, err := src.CreateCheckpoint(ctx, name, "move")
	if err != nil {
		return Manifest{}, fmt.Errorf("checkpoint: %w", err)
	}
	man := Manifest{Version: ManifestVersion, Sandbox: name, From: from, Checkpoint: ck.ID,
		Create: wire.CreateSandbox{Name: name, User: sb.User, Network: sb.Network, Limits: sb.Limits}}
	man.CheckpointBytes, err = m.upload(ctx, m.objKey(name, "checkpoint"), wire.ContentTypeCheckpointArchive, func(w io.Writer) (int64, error) {
		return src.ExportCheckpoint(ctx, name, ck.ID, w, "")
	})
	if err != nil {
		return Manifest{}, fmt.Errorf("upload checkpoint: %w", err)
	}
	man.SessionsBytes, err = m.upload(ctx, m.objKey(name, "sessions.tar"), wire.ContentTypeSessionArchive, func(w io.Writer) (int64, error) {
		return src.ExportSessions(ctx, name, w)
	})
	if err != nil {
		return Manifest{}, fmt.Errorf("upload sessions: %w", err)
	}
	man.Archived = time.Now().UTC()
	if _, err := m.store.putJSON(ctx, m.objKey(name, "manifest.json"), man, minio.PutObjectOptions{}); err != nil {
		return Manifest{}, fmt.Errorf("upload manifest: %w", err)
	}
	// The move's checkpoint has done its job on the source.
	if err := src.DeleteCheckpoint(ctx, name, ck.ID); err != nil {
		m.log.Warn("move: remove the move's checkpoint on the source", "sandbox", name, "err", err)
	}
	return man, nil
}

// upload streams what export writes into key, and returns its length.
// The exporter runs in a goroutine this call owns and waits for.
func (m *Mover) upload(ctx context.Context, key, contentType string, export func(io.Writer) (int64, error)) (int64, error) {
	pr, pw := io.Pipe()
	type result struct {
		n   int64
		err error
	}
	exported := make(chan result, 1)
	go func() {
		n, err := export(pw)
		pw.CloseWithError(err) // nil: EOF for the upload
		exported <- result{n, err}
	}()
	info, err := m.store.put(ctx, key, pr, -1, minio.PutObjectOptions{ContentType: contentType})
	pr.CloseWithError(errUploadEnded) // an upload that stopped early unblocks the exporter
	res := <-exported
	switch {
	case res.err != nil:
		return 0, res.err
	case err != nil:
		return 0, err
	case info.Size != res.n:
		return 0, &adapter.UnavailableError{Detail: fmt.Sprintf("move: %s stored %d bytes of %d", key, info.Size, res.n)}
	}
	return res.n, nil
}

var errUploadEnded = errors.New("upload ended")

// restore makes the sandbox of man on dst from the bucket's archives.
func (m *Mover) restore(ctx context.Context, dst *client.Client, man Manifest) error {
	// A sandbox of that name on the target already is not this move's to
	// overwrite (nor to remove when the move fails): refused.
	if _, err := dst.GetSandbox(ctx, man.Sandbox); err == nil {
		return errTargetHolds
	} else if !errors.Is(err, adapter.ErrNotFound) {
		return fmt.Errorf("look on the target: %w", err)
	}
	if _, err := dst.CreateSandbox(ctx, man.Create); err != nil {
		return fmt.Errorf("create: %w", err)
	}
	// Parked at once: it arrives as it left, and nothing runs in it
	// before its disk is the checkpoint's.
	if _, err := dst.Suspend(ctx, man.Sandbox); err != nil {
		return fmt.Errorf("park on the target: %w", err)
	}
	if err := m.download(ctx, m.objKey(man.Sandbox, "checkpoint"), man.CheckpointBytes, func(r io.Reader) error {
		_, _, err := dst.ImportCheckpoint(ctx, man.Sandbox, r)
		return err
	}); err != nil {
		return fmt.Errorf("import checkpoint: %w", err)
	}
	if _, err := dst.RestoreCheckpoint(ctx, man.Sandbox, man.Checkpoint); err != nil {
		return fmt.Errorf("restore checkpoint: %w", err)
	}
	if err := m.download(ctx, m.objKey(man.Sandbox, "sessions.tar"), man.SessionsBytes, func(r io.Reader) error {
		_, err := dst.ImportSessions(ctx, man.Sandbox, r)
		return err
	}); err != nil {
		return fmt.Errorf("import sessions: %w", err)
	}
	return nil
}

// removeArchive removes the archive objects of name (a failed move's, or
// a finished one's unless Options.KeepArchive); failures are logged.
func (m *Mover) removeArchive(ctx context.Context, name string) {
	for _, obj := range []string{"manifest.json", "checkpoint", "sessions.tar"} {
		if err := m.store.remove(context.WithoutCancel(ctx), m.objKey(name, obj)); err != nil {
			m.log.Warn("move: remove archive object", "sandbox", name, "object", obj, "err", err)
		}
	}
}

// errTargetHolds is restore's refusal of a target that has the name.
var errTargetHolds = errors.New("target holds the sandbox's name")

// syncRoute sets the pool's route of name from the bucket's record, when
// there is one.
func (m *Mover) syncRoute(ctx context.Context, name string) error {
	r, ok, err := m.store.Route(ctx, name)
	if err != nil {
		return err
	}
	if ok {
		m.pool.SetRoute(name, r)
	}
	return nil
}

// Route returns the runner the bucket's route record of sandbox name
// names ("" while it is archived), ok false when no move recorded one. A
// Store is the pool's fleet.RouteSource (fleet.Options.Routes).
func (s *Store) Route(ctx context.Context, name string) (string, bool, error) {
	var r Route
	_, err := s.getJSON(ctx, s.key("routes", name), &r)
	switch {
	case errors.Is(err, errNoObject):
		return "", false, nil
	case err != nil:
		return "", false, fmt.Errorf("read route: %w", err)
	case r.Sandbox != name:
		return "", false, &adapter.InvalidError{Detail: fmt.Sprintf("move: the route of %s names %q", name, r.Sandbox)}
	}
	return r.Runner, true, nil
}

var _ fleet.RouteSource = (*Store)(nil)

// download streams key, which must hold size bytes, into imp.
func (m *Mover) download(ctx context.Context, key string, size int64, imp func(io.Reader) error) error {
	obj, info, err := m.store.get(ctx, key)
	if err != nil {
		return err
	}
	defer obj.Close()
	if info.Size != size {
		return &adapter.InvalidError{Detail: fmt.Sprintf("move: %s holds %d bytes, its manifest says %d", key, info.Size, size)}
	}
	return imp(obj)
}
