package sessions

// Listing a sandbox's sessions (GET /v1/sandboxes/{name}/sessions): a page
// of records in id order, each described from its journal's metadata alone
// (no journal open, no shim round trip per session), with an opaque page
// token that names the sandbox's incarnation.

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentrunner/runner/daemon/apierr"
	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/daemon/sandboxes"
	"github.com/agentrunner/runner/journal"
	"github.com/agentrunner/runner/shim/sessiondir"
	"github.com/agentrunner/runner/wire"
)

// List is one page of the sessions of sandbox name, in start
// order, as query (limit, page_token) asks. It reads the registry and, for
// a session recorded as running, stats one file (listedSession): never a
// shim, so a shim that does not answer never stalls a listing, and the
// cost is O(records). An interrupted registry read is an error, never a
// short page.
func (s *Manager) List(ctx context.Context, name, rawQuery string) (wire.SessionList, error) {
	if err := sandboxes.ValidName(name); err != nil {
		return wire.SessionList{}, err
	}
	limit, tok, err := parseListQuery(rawQuery)
	if err != nil {
		return wire.SessionList{}, err
	}
	var after *registry.SessionCursor
	var tokInc string
	if tok != "" {
		c, inc, err := decodeSessionToken(tok)
		if err != nil {
			return wire.SessionList{}, err
		}
		after, tokInc = &c, inc
	}
	sb, list, more, err := s.reg.ListSessionsPage(name, after, limit)
	if errors.Is(err, registry.ErrNotFound) {
		return wire.SessionList{}, apierr.NotFound("sandbox %q does not exist", name)
	}
	if err != nil {
		return wire.SessionList{}, apierr.Unavailable("read registry: %v", err)
	}
	if after != nil && tokInc != sb.Incarnation {
		// A position in another sandbox's (or an earlier incarnation's)
		// listing means nothing here: skipping by it could hide sessions.
		return wire.SessionList{}, apierr.Invalid("page_token is from another sandbox or incarnation")
	}
	// The file metadata of a page's sessions is read by a few workers:
	// system calls overlap, and the answer keeps the registry's order.
	out := wire.SessionList{Sessions: make([]wire.Session, len(list))}
	workers := min(listWorkers, (len(list)+listPerWorker-1)/listPerWorker)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			buf := make([]byte, 8<<10) // directory reads (streamLength)
			for i := w; i < len(list); i += workers {
				out.Sessions[i] = s.listedSession(list[i], buf)
			}
		})
	}
	wg.Wait()
	if more && len(list) > 0 {
		out.NextPageToken = encodeSessionToken(sb.Incarnation, list[len(list)-1])
	}
	return out, nil
}

// listedSession describes rec for a listing: the record, and for a
// session recorded as running (or starting) what its journal's files say,
// by their metadata alone: a stat of exit.json, which the journal
// publishes last, and the length of each stream (a directory listing and
// a stat of its last segment). No shim, no index.db, no status file: a
// listing costs the registry read plus a constant number of metadata
// reads per session, and a shim that does not answer costs nothing. When
// exit.json is there (the session ended and its record lags) its exit is
// read and listed; a listing never writes the registry (the session's
// exit watch records it, exitwatch.go). Files that cannot be read list the entry as recorded, with
// status_error.
func (s *Manager) listedSession(rec registry.Session, buf []byte) wire.Session {
	out := ToWireSession(rec)
	if out.Exit != nil {
		out.Lengths = out.Exit.Lengths
		return out
	}
	if rec.State != wire.SessionRunning && rec.State != StateStarting {
		return out
	}
	jdir := journalDir(s.Dir(rec))
	_, err := os.Stat(filepath.Join(jdir, journalExitFile))
	switch {
	case err == nil:
		err = listExit(jdir, &out)
	case errors.Is(err, fs.ErrNotExist):
		err = listLengths(jdir, rec.Request.TTY, &out, buf)
	}
	if err != nil && (rec.State == wire.SessionRunning || s.startedSince(rec)) {
		out.StatusError = err.Error()
	}
	return out
}

// listLengths sets out's lengths from the segment files of the journal
// at jdir (streamLength), one stream of the session at a time; buf is the
// caller's directory-read buffer, reused across a listing.
func listLengths(jdir string, tty bool, out *wire.Session, buf []byte) error {
	lengths := make(map[string]int64, 2)
	for _, name := range StreamsOf(tty) {
		n, err := streamLength(filepath.Join(jdir, name), buf)
		if err != nil {
			return err
		}
		lengths[name] = n
	}
	out.Lengths = lengths
	return nil
}

// streamLength is the length of the journal stream in directory sdir
// from its segment files alone, by package journal's documented on-disk
// format: DIR/<stream>/<first offset as 20 digits>.seg, each segment
// holding the stream's bytes from its first offset, so the length is the
// last segment's first offset plus its size. One directory read and one
// stat, as raw system calls: a listing of a thousand sessions pays no
// poller registration, sort or per-entry allocation (journal.Open and
// Bounds cost about three times as many calls, and a read of
// journal.json). A last segment gone between the two (only a Recover
// after a power loss removes one) is looked for again.
func streamLength(sdir string, buf []byte) (int64, error) {
	for range 3 {
		fd, err := unix.Open(sdir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return 0, &fs.PathError{Op: "open", Path: sdir, Err: err}
		}
		first, name, err := lastSegment(fd, buf)
		if err != nil {
			unix.Close(fd)
			return 0, fmt.Errorf("list segments %s: %w", sdir, err)
		}
		var st unix.Stat_t
		err = unix.Fstatat(fd, name, &st, 0)
		unix.Close(fd)
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			return 0, &fs.PathError{Op: "stat", Path: filepath.Join(sdir, name), Err: err}
		}
		return first + st.Size, nil
	}
	return 0, fmt.Errorf("list segments %s: unstable directory", sdir)
}

// journalSegSuffix and journalSegDigits name a journal segment file.
const (
	journalSegSuffix = ".seg"
	journalSegDigits = 20
)

// lastSegment reads the directory fd and returns the greatest segment
// first offset in it and that segment's file name.
func lastSegment(fd int, buf []byte) (int64, string, error) {
	last, lastName := int64(-1), ""
	var names []string
	for {
		n, err := unix.ReadDirent(fd, buf)
		if err != nil {
			return 0, "", err
		}
		if n <= 0 {
			break
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names[:0])
		for _, name := range names {
			if len(name) != journalSegDigits+len(journalSegSuffix) || !strings.HasSuffix(name, journalSegSuffix) {
				continue
			}
			off, err := strconv.ParseInt(name[:journalSegDigits], 10, 64)
			if err == nil && off > last {
				last, lastName = off, name
			}
		}
	}
	if last < 0 {
		return 0, "", errors.New("no segments")
	}
	return last, lastName, nil
}

// listExit sets out's state, exit and lengths from the exit record the
// journal at jdir published.
func listExit(jdir string, out *wire.Session) error {
	j, err := journal.Open(jdir)
	if err != nil {
		return err
	}
	defer j.Close()
	e, ok, err := j.Exit()
	if err != nil || !ok {
		return err
	}
	exit := sessiondir.WireExit(e)
	out.State, out.Exit, out.Lengths = endedState(exit), &exit, exit.Lengths
	return nil
}

// journalExitFile is the file a journal publishes its exit record in, last
// (package journal's on-disk format): its presence says the session
// ended.
const journalExitFile = "exit.json"

// parseListQuery reads a listing's limit (wire.DefaultListLimit when
// absent) and page_token.
func parseListQuery(rawQuery string) (int, string, error) {
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return 0, "", apierr.Invalid("query: %v", err)
	}
	limit := wire.DefaultListLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > wire.MaxListLimit {
			return 0, "", apierr.Invalid("limit %q: want 1..%d", v, wire.MaxListLimit)
		}
		limit = n
	}
	return limit, q.Get("page_token"), nil
}

// sessionToken is what a session listing's page token encodes: the
// incarnation of the sandbox it lists and the last listed session's place
// in start order.
type sessionToken struct {
	Incarnation string `json:"i"`
	CreatedAt   int64  `json:"t"` // Unix nanoseconds
	ID          string `json:"s"`
}

func encodeSessionToken(incarnation string, last registry.Session) string {
	var at int64 // the registry orders times before 1970 (a zero time) as 0
	if last.CreatedAt.After(time.Unix(0, 0)) {
		at = last.CreatedAt.UnixNano()
	}
	raw, _ := json.Marshal(sessionToken{Incarnation: incarnation, CreatedAt: at, ID: last.ID})
	return base64.RawURLEncoding.EncodeToString(raw)
}

// decodeSessionToken returns the position and incarnation tok names, or
// invalid for anything this runnerd did not make.
func decodeSessionToken(tok string) (registry.SessionCursor, string, error) {
	raw, err := base64.RawURLEncoding.DecodeString(tok)
	var t sessionToken
	if err == nil {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		err = dec.Decode(&t)
	}
	if err != nil || t.Incarnation == "" || ValidSessionID(t.ID) != nil {
		return registry.SessionCursor{}, "", apierr.Invalid("malformed page_token")
	}
	return registry.SessionCursor{CreatedAt: time.Unix(0, t.CreatedAt).UTC(), ID: t.ID}, t.Incarnation, nil
}

// listWorkers bounds the goroutines that read a listing page's file
// metadata; each takes at least listPerWorker sessions.
const (
	listWorkers   = 4
	listPerWorker = 64
)
