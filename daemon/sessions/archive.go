package sessions

// Session archives: the ended sessions of one sandbox (records and
// journals) as one tar stream, so that a parked sandbox moves to another
// runnerd with its history (docs/protocol.md, "Session archives";
// docs/operations.md, "Moving a parked sandbox"). The checkpoint archive
// carries the disk; this carries what the sessions said.
//
// The archive is input from outside (a bucket anyone holding its
// credentials can write), read by root: the importer accepts only the
// journal's own file names, regular files, under directories it made
// itself, bounded in count and bytes, and opens every journal it wrote
// before any record names it. Nothing is kept of a refused archive.

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentrunner/runner/daemon/apierr"
	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/journal"
	"github.com/agentrunner/runner/shim/sessiondir"
	"github.com/agentrunner/runner/wire"
)

// ArchiveVersion is the version of the session archive's format.
const ArchiveVersion = 1

// archiveManifest is the archive's first entry.
const archiveManifest = "sessions.json"

// Archive bounds: what an importer holds in memory and writes at most.
const (
	maxArchiveManifest = 8 << 20 // the manifest's JSON
	maxArchiveSessions = 100000  // sessions in one archive
	maxArchiveFiles    = 1 << 20 // files in one archive
)

// ArchivedSession is one session in an archive's manifest: what its
// record says, less what belongs to the host (key, pid, incarnation).
type ArchivedSession struct {
	ID        string             `json:"id"`
	Request   wire.CreateSession `json:"request"`
	State     string             `json:"state"`
	StartedAt time.Time          `json:"started_at"`
	CreatedAt time.Time          `json:"created_at"`
	Exit      *wire.Exit         `json:"exit"`
}

// archiveHeader is the manifest: the format's version, the sandbox the
// sessions came from (informative) and the sessions, oldest first.
type archiveHeader struct {
	Version  int               `json:"version"`
	Sandbox  string            `json:"sandbox"`
	Sessions []ArchivedSession `json:"sessions"`
}

// ExportArchive writes the sessions of sandbox name to w as a session
// archive. Every session must have ended: a running (or starting) one is
// a conflict, before the first byte is written. The sandbox's lock is held
// throughout, so no session starts meanwhile. An error after the first
// byte leaves w an archive no importer accepts (no end-of-archive marker).
func (s *Manager) ExportArchive(ctx context.Context, name string, w io.Writer) error {
	unlock := s.sbx.Locks().Lock(name)
	defer unlock()
	live, err := s.sbx.Get(name)
	if err != nil {
		return err
	}
	recs, err := s.reg.ListSessions(name)
	if err != nil {
		return s.sbx.RegistryErr(err, name)
	}
	hdr := archiveHeader{Version: ArchiveVersion, Sandbox: name}
	var keep []registry.Session
	for _, rec := range recs {
		if rec.Incarnation != live.Incarnation {
			continue // an earlier sandbox's, never the caller's
		}
		rec, err := s.Refresh(rec)
		if err != nil {
			return err
		}
		if (rec.State != wire.SessionExited && rec.State != wire.SessionLost) || rec.Exit == nil {
			return apierr.Conflict("session %q of sandbox %q has not ended: a sandbox's sessions are archived only once all have ended", rec.ID, name)
		}
		hdr.Sessions = append(hdr.Sessions, ArchivedSession{ID: rec.ID, Request: rec.Request, State: rec.State,
			StartedAt: rec.StartedAt, CreatedAt: rec.CreatedAt, Exit: rec.Exit})
		keep = append(keep, rec)
	}
	// The files are listed before the first byte, so a journal that is
	// still written (a writer alive) refuses the export whole.
	files := make([][]string, len(keep))
	for i, rec := range keep {
		jdir := journalDir(s.Dir(rec))
		j, err := journal.Open(jdir)
		if err != nil {
			return apierr.Unavailable("open journal of session %q: %v", rec.ID, err)
		}
		alive, err := j.WriterAlive()
		j.Close()
		if err != nil || alive {
			return apierr.Conflict("session %q of sandbox %q still has a journal writer: a sandbox's sessions are archived only once all have ended", rec.ID, name)
		}
		if files[i], err = journalFiles(jdir); err != nil {
			return apierr.Unavailable("list journal of session %q: %v", rec.ID, err)
		}
	}
	body, err := json.Marshal(hdr)
	if err != nil {
		return fmt.Errorf("encode session archive manifest: %w", err)
	}
	tw := tar.NewWriter(w)
	now := time.Now().UTC()
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: archiveManifest, Mode: 0o644, Size: int64(len(body)), ModTime: now}); err != nil {
		return fmt.Errorf("write session archive: %w", err)
	}
	if _, err := tw.Write(body); err != nil {
		return fmt.Errorf("write session archive: %w", err)
	}
	for i, rec := range keep {
		jdir := journalDir(s.Dir(rec))
		for _, rel := range files[i] {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := tarFile(tw, filepath.Join(jdir, rel), rec.ID+"/journal/"+rel); err != nil {
				return fmt.Errorf("archive session %s: %w", rec.ID, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("write session archive: %w", err)
	}
	return nil
}

// journalFiles lists the files of a finished journal the importer
// accepts, relative to its directory; anything else (the writer's
// temporary files, a reserve) stays behind.
func journalFiles(jdir string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(jdir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(jdir, p)
		if err != nil || rel == "." || d.IsDir() {
			return err
		}
		if d.Type().IsRegular() && journalName(rel) {
			out = append(out, rel)
		}
		return nil
	})
	return out, err
}

// tarFile writes the regular file at path as entry name.
func tarFile(tw *tar.Writer, path, name string) error {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", path)
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: fi.Size(), ModTime: fi.ModTime()}); err != nil {
		return err
	}
	// A finished journal does not change; a file that did would fail
	// the tar writer's size check rather than be archived torn.
	_, err = io.CopyN(tw, f, fi.Size())
	return err
}

var (
	streamName  = regexp.MustCompile(`^[a-z0-9_-]{1,32}$`)
	segmentName = regexp.MustCompile(`^[0-9]{20}\.seg$`)
)

// journalName reports whether rel (slash-separated, relative to a
// journal's directory) is a file of a finished journal: its meta, exit
// record, index, or a stream's segment.
func journalName(rel string) bool {
	switch rel {
	case "journal.json", "exit.json", "index.db":
		return true
	}
	stream, seg, ok := strings.Cut(rel, "/")
	return ok && streamName.MatchString(stream) && segmentName.MatchString(seg)
}

// ImportArchive reads a session archive from r into sandbox name, which
// must exist: each session becomes a record of the sandbox's current
// incarnation, with the same id, request, state and exit, and its journal
// reads from byte 0 as it did where it was exported. An id the sandbox
// already has is a conflict (session_exists); a malformed, truncated or
// hostile archive is invalid; either way nothing is kept. The archive's
// journals together may hold at most the sandbox's journal bound
// (Config.SandboxJournalBytes), when there is one.
func (s *Manager) ImportArchive(ctx context.Context, name string, r io.Reader) ([]registry.Session, error) {
	unlock := s.sbx.Locks().Lock(name)
	defer unlock()
	live, err := s.sbx.Get(name)
	if err != nil {
		return nil, err
	}
	tr := tar.NewReader(r)
	hdr, err := readManifest(tr)
	if err != nil {
		return nil, err
	}
	byID := make(map[string]*imported, len(hdr.Sessions))
	var order []*imported
	for _, a := range hdr.Sessions {
		if _, err := s.reg.GetSession(name, a.ID); err == nil {
			return nil, apierr.ConflictFor(wire.ReasonSessionExists, "%s: session %q exists in sandbox %q", wire.DetailConflict, a.ID, name)
		} else if !errors.Is(err, registry.ErrNotFound) {
			return nil, s.sbx.RegistryErr(err, name)
		}
		im := &imported{a: a, key: registry.NewID()}
		im.staging = filepath.Join(s.cfg.StateDir, "s", ".import-"+im.key)
		byID[a.ID], order = im, append(order, im)
	}
	done := false
	defer func() {
		if !done {
			for _, im := range order {
				os.RemoveAll(im.staging)
				os.RemoveAll(filepath.Join(s.cfg.StateDir, "s", im.key))
			}
		}
	}()
	if err := s.unpack(ctx, tr, byID, s.cfg.SandboxJournalBytes); err != nil {
		return nil, err
	}
	for _, im := range order {
		if err := checkImported(im); err != nil {
			return nil, err
		}
	}
	if err := syncDir(filepath.Join(s.cfg.StateDir, "s")); err != nil {
		return nil, apierr.WriteFailed("sync imported journals: %v", err)
	}
	for _, im := range order {
		if err := os.Rename(im.staging, filepath.Join(s.cfg.StateDir, "s", im.key)); err != nil {
			return nil, apierr.WriteFailed("place imported session %q: %v", im.a.ID, err)
		}
	}
	// Directories first, records after (a crash in between leaves
	// directories no record names, which Reconcile's orphan sweep removes).
	var out []registry.Session
	for _, im := range order {
		rec := registry.Session{Sandbox: name, ID: im.a.ID, Incarnation: live.Incarnation, Key: im.key,
			Request: im.a.Request, State: im.a.State, StartedAt: im.a.StartedAt, CreatedAt: im.a.CreatedAt, Exit: im.a.Exit}
		rec, err := s.reg.CreateSession(rec, func(sb registry.Sandbox) error {
			if sb.Incarnation != live.Incarnation {
				return registry.ErrNotFound
			}
			return nil
		})
		if err != nil {
			for _, prev := range out {
				_ = s.reg.DeleteSession(name, prev.ID)
				s.bookDrop(name, prev.ID)
			}
			if errors.Is(err, registry.ErrExists) {
				return nil, apierr.ConflictFor(wire.ReasonSessionExists, "%s: session %q exists in sandbox %q", wire.DetailConflict, im.a.ID, name)
			}
			return nil, s.sbx.RegistryErr(err, name)
		}
		s.bookAdd(rec)
		out = append(out, rec)
	}
	done = true
	s.log.Info("sessions imported", "request_id", s.cfg.RequestID(ctx), "sandbox", name, "sessions", len(out))
	return out, nil
}

// imported is one session of an archive being imported.
type imported struct {
	a       ArchivedSession
	key     string // its directory's name under STATE/s once placed
	staging string // where its files are written first
	files   int
}

// readManifest reads and checks the archive's first entry.
func readManifest(tr *tar.Reader) (archiveHeader, error) {
	var hdr archiveHeader
	th, err := tr.Next()
	if err != nil {
		return hdr, apierr.Invalid("read session archive: %v", err)
	}
	if th.Name != archiveManifest || th.Typeflag != tar.TypeReg || th.Size > maxArchiveManifest {
		return hdr, apierr.Invalid("session archive: the first entry is not %s (at most %d bytes)", archiveManifest, maxArchiveManifest)
	}
	body, err := io.ReadAll(io.LimitReader(tr, maxArchiveManifest))
	if err != nil {
		return hdr, apierr.Invalid("read session archive manifest: %v", err)
	}
	if err := json.Unmarshal(body, &hdr); err != nil {
		return hdr, apierr.Invalid("session archive manifest: %v", err)
	}
	if hdr.Version != ArchiveVersion {
		return hdr, apierr.Invalid("session archive version %d: this runnerd reads version %d only", hdr.Version, ArchiveVersion)
	}
	if len(hdr.Sessions) > maxArchiveSessions {
		return hdr, apierr.Invalid("session archive holds %d sessions, at most %d", len(hdr.Sessions), maxArchiveSessions)
	}
	seen := map[string]bool{}
	for _, a := range hdr.Sessions {
		if err := ValidSessionID(a.ID); err != nil {
			return hdr, apierr.Invalid("session archive: %v", err)
		}
		if seen[a.ID] {
			return hdr, apierr.Invalid("session archive names session %q twice", a.ID)
		}
		seen[a.ID] = true
		if a.Exit == nil || (a.State != wire.SessionExited && a.State != wire.SessionLost) || a.State != endedState(*a.Exit) {
			return hdr, apierr.Invalid("session archive: session %q has not ended (state %q)", a.ID, a.State)
		}
		if a.Request.ID != "" && a.Request.ID != a.ID {
			return hdr, apierr.Invalid("session archive: session %q carries the request of %q", a.ID, a.Request.ID)
		}
	}
	return hdr, nil
}

// unpack writes the archive's journal files into each session's staging
// directory: only a listed session's journal names, regular files, each
// once, created (never opened) under directories made here.
func (s *Manager) unpack(ctx context.Context, tr *tar.Reader, byID map[string]*imported, bound int64) error {
	var total int64
	nfiles := 0
	for {
		if err := ctx.Err(); err != nil {
			return apierr.Unavailable("import sessions: %v", err)
		}
		th, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return apierr.Invalid("read session archive: %v", err)
		}
		id, rest, ok := strings.Cut(th.Name, "/")
		rel, hasJournal := strings.CutPrefix(rest, "journal/")
		im := byID[id]
		if !ok || !hasJournal || im == nil || !journalName(rel) || th.Typeflag != tar.TypeReg {
			return apierr.Invalid("session archive: entry %q is not a file of a listed session's journal", th.Name)
		}
		if nfiles++; nfiles > maxArchiveFiles {
			return apierr.Invalid("session archive holds more than %d files", maxArchiveFiles)
		}
		if total += th.Size; th.Size < 0 || (bound > 0 && total > bound) {
			return apierr.Invalid("session archive: its journals exceed %d bytes (the sandbox's journal bound)", bound)
		}
		if err := writeEntry(im.staging, rel, tr, th.Size); err != nil {
			return err
		}
		im.files++
	}
}

// writeEntry creates staging/rel (rel checked by journalName: at most one
// directory deep) with size bytes from r.
func writeEntry(staging, rel string, r io.Reader, size int64) error {
	jdir := filepath.Join(staging, "journal")
	for _, d := range []string{staging, jdir} {
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return apierr.WriteFailed("make imported journal directory: %v", err)
		}
	}
	if dir, _, ok := strings.Cut(rel, "/"); ok {
		if err := os.Mkdir(filepath.Join(jdir, dir), 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return apierr.WriteFailed("make imported journal directory: %v", err)
		}
	}
	// O_EXCL|O_NOFOLLOW: a name that came twice is refused, and nothing
	// here is followed (the directories are this importer's own).
	f, err := os.OpenFile(filepath.Join(jdir, rel), os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o644)
	if errors.Is(err, os.ErrExist) {
		return apierr.Invalid("session archive names %s twice", rel)
	}
	if err != nil {
		return apierr.WriteFailed("write imported journal: %v", err)
	}
	n, err := io.Copy(f, io.LimitReader(r, size))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if apierr.IsNoSpace(err) {
			return apierr.NoSpace("import sessions", err)
		}
		return apierr.Invalid("read session archive: %v", err)
	}
	if n != size {
		return apierr.Invalid("session archive cut inside %s", rel)
	}
	return nil
}

// checkImported opens the journal written for im: it must read, have
// ended as the manifest says (reason, code, signal), and carry the streams
// of the session's request, whole. The record takes the journal's exit.
func checkImported(im *imported) error {
	if im.files == 0 {
		return apierr.Invalid("session archive: no journal for session %q", im.a.ID)
	}
	j, err := journal.Open(filepath.Join(im.staging, "journal"))
	if err != nil {
		return apierr.Invalid("session archive: journal of session %q: %v", im.a.ID, err)
	}
	defer j.Close()
	e, ok, err := j.Exit()
	if err != nil || !ok {
		return apierr.Invalid("session archive: journal of session %q holds no exit record", im.a.ID)
	}
	want := im.a.Exit
	if e.Reason != want.Reason || e.Code != want.Code || e.Signal != want.Signal {
		return apierr.Invalid("session archive: session %q's record says %s %d/%d, its journal %s %d/%d", im.a.ID, want.Reason, want.Code, want.Signal, e.Reason, e.Code, e.Signal)
	}
	// The record's exit is the journal's own (the truth a reader of this
	// runnerd compares against), never the manifest's other fields.
	we := sessiondir.WireExit(e)
	im.a.Exit, im.a.State = &we, endedState(we)
	if got, wantS := slices.Sorted(slices.Values(j.Streams())), slices.Sorted(slices.Values(StreamsOf(im.a.Request.TTY))); !slices.Equal(got, wantS) {
		return apierr.Invalid("session archive: session %q's journal has streams %v, its request %v", im.a.ID, got, wantS)
	}
	for _, st := range j.Streams() {
		start, end, err := j.Bounds(st)
		if err != nil {
			return apierr.Invalid("session archive: journal of session %q: %v", im.a.ID, err)
		}
		if n, ok := e.Lengths[st]; ok && n != end {
			return apierr.Invalid("session archive: session %q's %s ends at %d, its exit record says %d", im.a.ID, st, end, n)
		}
		if err := j.Complete(st, start, end); err != nil {
			return apierr.Invalid("session archive: session %q's %s is not whole: %v", im.a.ID, st, err)
		}
	}
	return nil
}

// syncDir makes everything written under dir's file system durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}
