package journal

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/agentrunner/runner/internal/atomicfile"
	"golang.org/x/sys/unix"
)

// File names inside a journal directory.
const (
	indexName    = "index.db"
	indexTmpName = ".index.db.creating"
	exitName     = "exit.json"
	metaName     = "journal.json"
	// ReserveFile is the writer's reserve (ReserveBytes, allocated at
	// Create, removed first thing by Finish): the space and the inode
	// that finishing takes, held so that a journal can always be finished
	// on a file system its own or anyone's output has filled.
	ReserveFile = "reserve"
	metaTmpName = ".journal.json.tmp"
	exitTmpName = ".exit.json.tmp"
	segSuffix   = ".seg"
	segNameLen  = 20 // digits of the first offset
)

// Defaults for zero Options fields.
const (
	DefaultSegmentBytes = 64 << 20
	DefaultSyncInterval = time.Second
	DefaultMarkInterval = time.Second
)

// Exit reasons.
const (
	ReasonExited   = "exited"
	ReasonSignaled = "signaled"
	ReasonLost     = "lost"
)

// Options configure a new journal. They are stored in the index, so Recover
// continues with the same options.
type Options struct {
	// Streams names the journal's streams, e.g. {"stdout", "stderr"} for
	// pipes or {"stdout"} for a PTY. Names match [a-z0-9_-]{1,32}.
	Streams []string
	// SegmentBytes is the size at which a segment is sealed and a new one
	// started. 0 means DefaultSegmentBytes.
	SegmentBytes int64
	// RetainBytes caps each stream: on every segment roll the oldest
	// segments are deleted while the stream holds more than RetainBytes, so
	// a stream uses at most RetainBytes+SegmentBytes of disk. 0 keeps
	// everything.
	RetainBytes int64
	// SyncInterval is how often the writer fsyncs segments and commits the
	// index. 0 means DefaultSyncInterval.
	SyncInterval time.Duration
	// MarkInterval is the granularity of offset<->time marks. 0 means
	// DefaultMarkInterval.
	MarkInterval time.Duration
	// DeferCreateSync makes Create skip its fsyncs (of the new
	// directories, journal.json and index.db): the journal is made durable
	// at its first sync point instead, with the first bytes. Until then a
	// power loss can lose the whole (still empty) journal; see the package
	// documentation. Used by Create only; not stored.
	DeferCreateSync bool
}

func (o Options) withDefaults() (Options, error) {
	if len(o.Streams) == 0 {
		return o, errors.New("journal: no streams")
	}
	seen := map[string]bool{}
	for _, s := range o.Streams {
		if !validStream(s) {
			return o, fmt.Errorf("journal: invalid stream name %q", s)
		}
		if seen[s] {
			return o, fmt.Errorf("journal: duplicate stream name %q", s)
		}
		seen[s] = true
	}
	o.Streams = slices.Clone(o.Streams)
	if o.SegmentBytes < 0 || o.RetainBytes < 0 || o.SyncInterval < 0 || o.MarkInterval < 0 {
		return o, errors.New("journal: negative option")
	}
	if o.SegmentBytes == 0 {
		o.SegmentBytes = DefaultSegmentBytes
	}
	if o.SyncInterval == 0 {
		o.SyncInterval = DefaultSyncInterval
	}
	if o.MarkInterval == 0 {
		o.MarkInterval = DefaultMarkInterval
	}
	return o, nil
}

func validStream(s string) bool {
	if len(s) < 1 || len(s) > 32 {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// Exit is the exit record. Its JSON shape is part of the on-disk format
// (exit.json and the index's exit key).
type Exit struct {
	Reason  string           `json:"reason"`           // "exited" | "signaled" | "lost"
	Code    int              `json:"code"`             // meaningful only when Reason=="exited"
	Signal  int              `json:"signal,omitempty"` // only when Reason=="signaled"
	Detail  string           `json:"detail,omitempty"`
	Lengths map[string]int64 `json:"lengths"` // final length of every stream (filled by Finish)
	Time    time.Time        `json:"time"`
	// Terminated says the command ended after its supervisor was asked to
	// stop it (the shim's terminate: TerminateSession, suspend, destroy).
	// Code and Signal stay the truth of how it ended. Records written
	// before this field existed read as false.
	Terminated bool `json:"terminated,omitempty"`
	// OOMKilled says the command ended by SIGKILL while the OOM kill
	// count of its cgroup rose during its life: the kernel killed it for
	// memory. Reason stays ReasonSignaled, Signal 9. Records written
	// before this field existed read as false.
	OOMKilled bool `json:"oom_killed,omitempty"`
	// UnstoredBytes counts output the command wrote that its journal
	// could not take (a full disk or a disk budget) and that its
	// supervisor gave up because the session was terminated after the
	// command ended; Detail names the write error. The Lengths are what
	// was stored, all readable. 0 in every other case: output is never
	// dropped otherwise.
	UnstoredBytes int64 `json:"unstored_bytes,omitempty"`
	// Cause names, for a program, why output went unstored: CauseDiskBudget
	// (the sandbox's journal budget, which its writer enforces) or
	// CauseDiskFull (the file system refused: full, or a disk budget the
	// kernel enforces). Empty otherwise.
	Cause string `json:"cause,omitempty"`
}

// Exit causes (Exit.Cause).
const (
	CauseDiskBudget = "disk_budget"
	CauseDiskFull   = "disk_full"
)

func segName(off int64) string { return fmt.Sprintf("%020d%s", off, segSuffix) }

func segPath(dir, stream string, off int64) string {
	return filepath.Join(dir, stream, segName(off))
}

// parseSegName returns the first offset named by a segment file name.
func parseSegName(name string) (int64, bool) {
	if len(name) != segNameLen+len(segSuffix) || !strings.HasSuffix(name, segSuffix) {
		return 0, false
	}
	off, err := strconv.ParseInt(name[:segNameLen], 10, 64)
	if err != nil || off < 0 {
		return 0, false
	}
	return off, true
}

// listSegments returns the first offsets of the segments of a stream
// directory, ascending.
func listSegments(streamDir string) ([]int64, error) {
	f, err := os.Open(streamDir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	offs := make([]int64, 0, len(names))
	for _, n := range names {
		if off, ok := parseSegName(n); ok {
			offs = append(offs, off)
		}
	}
	slices.Sort(offs)
	return offs, nil
}

// readExit reads dir/exit.json; ok is false when it does not exist.
func readExit(dir string) (e Exit, ok bool, err error) {
	b, err := os.ReadFile(filepath.Join(dir, exitName))
	if errors.Is(err, fs.ErrNotExist) {
		return Exit{}, false, nil
	}
	if err != nil {
		return Exit{}, false, fmt.Errorf("read exit record: %w", err)
	}
	if err := json.Unmarshal(b, &e); err != nil {
		return Exit{}, false, fmt.Errorf("decode exit record: %w: %w", ErrCorrupt, err)
	}
	return e, true, nil
}

// writeExit publishes dir/exit.json atomically and durably: tmp file,
// fsync, rename, fsync of the directory.
func writeExit(dir string, b []byte) error {
	if err := publishExit(dir, b); err != nil {
		return err
	}
	return atomicfile.SyncDir(dir)
}

// publishExit writes exit.json (fsynced) and renames it into place; the
// directory entry is durable once dir is fsynced, which the caller does.
func publishExit(dir string, b []byte) error {
	tmp := filepath.Join(dir, exitTmpName)
	// Overwritten in place, not truncated first: the temporary file may
	// be the journal's reserve (releaseReserve), whose inode and first
	// block are what a full file system would refuse.
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("write exit record: %w", err)
	}
	if _, err := f.WriteAt(b, 0); err != nil {
		f.Close()
		return fmt.Errorf("write exit record: %w", err)
	}
	if err := f.Truncate(int64(len(b))); err != nil {
		f.Close()
		return fmt.Errorf("write exit record: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("sync exit record: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close exit record: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, exitName)); err != nil {
		return fmt.Errorf("publish exit record: %w", err)
	}
	return nil
}

func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("sync %s: %w", filepath.Base(path), err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", filepath.Base(path), err)
	}
	return nil
}

// writerAlive reports whether a writer holds index.db: it tries a shared,
// non-blocking flock, which fails exactly while a writer's exclusive lock
// is held. The probe never blocks the writer (it holds nothing long).
func writerAlive(dir string) (bool, error) {
	fd, err := unix.Open(filepath.Join(dir, indexName), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, fmt.Errorf("probe writer: %w", err)
	}
	defer unix.Close(fd)
	for {
		err = unix.Flock(fd, unix.LOCK_SH|unix.LOCK_NB)
		if err != unix.EINTR {
			break
		}
	}
	switch err {
	case nil:
		return false, nil // closing the fd drops the probe's lock
	case unix.EWOULDBLOCK:
		return true, nil
	default:
		return false, fmt.Errorf("probe writer: %w", err)
	}
}

// bootID identifies the running kernel boot. Recover compares it with the
// one stored in the index to tell a writer crash (page cache intact: files
// are the truth) from a power loss or reboot (only synced bytes are).
// A variable so tests can simulate a reboot.
var bootID = func() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// Index (index.db) layout. All integers are big-endian uint64.
//
//	meta/   version, options (JSON), boot_id
//	exit    the exit record JSON (top-level key in bucket meta: "exit")
//	s/<stream>/  length (synced length), start (first retained offset)
//	s/<stream>/segs/<first offset> -> sealed length, or empty for the active segment
//	s/<stream>/marks/<unix nanos>   -> offset of the first byte written at that time
var (
	bktMeta    = []byte("meta")
	bktStreams = []byte("s")
	bktSegs    = []byte("segs")
	bktMarks   = []byte("marks")
	keyVersion = []byte("version")
	keyOptions = []byte("options")
	keyBootID  = []byte("boot_id")
	keyExit    = []byte("exit")
	keyLength  = []byte("length")
	keyStart   = []byte("start")
)

const formatVersion = 1

func u64(v int64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(v))
	return b[:]
}

func getU64(b []byte) int64 {
	if len(b) != 8 {
		return 0
	}
	return int64(binary.BigEndian.Uint64(b))
}

// storedOptions is the JSON form of Options in the index.
type storedOptions struct {
	Streams      []string      `json:"streams"`
	SegmentBytes int64         `json:"segment_bytes"`
	RetainBytes  int64         `json:"retain_bytes"`
	SyncInterval time.Duration `json:"sync_interval_ns"`
	MarkInterval time.Duration `json:"mark_interval_ns"`
}

// journalMeta is journal.json: written once by Create (tmp+rename, before
// index.db appears) and never changed, so readers learn the streams and the
// segment size without opening the index. Segments are aligned: every
// segment starts at a multiple of SegmentBytes, so a reader maps a cursor
// to its segment file by arithmetic, whatever the journal's size.
type journalMeta struct {
	Version      int      `json:"version"`
	Streams      []string `json:"streams"`
	SegmentBytes int64    `json:"segment_bytes"`
}

func writeMeta(dir string, o Options) error {
	b, _ := json.Marshal(journalMeta{formatVersion, o.Streams, o.SegmentBytes})
	tmp := filepath.Join(dir, metaTmpName)
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	if !o.DeferCreateSync {
		if err := syncFile(tmp); err != nil {
			return err
		}
	}
	return os.Rename(tmp, filepath.Join(dir, metaName))
}

func readMeta(dir string) (journalMeta, error) {
	var m journalMeta
	b, err := os.ReadFile(filepath.Join(dir, metaName))
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("%w: journal.json: %w", ErrCorrupt, err)
	}
	return m, nil
}
