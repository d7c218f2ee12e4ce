package checkpoint_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/checkpoint"
	"github.com/klauspost/compress/zstd"
	"github.com/restic/chunker"
)

// The archive as docs/archive.md describes it, read and written here from
// that description (not from the package's code), as a reader in another
// language would.

type rec struct {
	kind    byte
	payload []byte
}

type arcEntry struct {
	Path    string   `json:"path"`
	Type    string   `json:"type"`
	Mode    uint32   `json:"mode"`
	UID     uint32   `json:"uid"`
	GID     uint32   `json:"gid"`
	MtimeNS int64    `json:"mtime_ns"`
	Target  string   `json:"target,omitempty"`
	Size    int64    `json:"size,omitempty"`
	Chunks  []string `json:"chunks,omitempty"`
}

type arcSnapshot struct {
	ID       string       `json:"id"`
	Comment  string       `json:"comment,omitempty"`
	Created  time.Time    `json:"created"`
	Size     int64        `json:"size"`
	Files    int          `json:"files"`
	Skipped  int          `json:"skipped"`
	FrozenNS int64        `json:"frozen_ns"`
	Trees    [][]arcEntry `json:"trees"`
}

// parseArchive splits a well-formed archive into its 12-byte header and
// records.
func parseArchive(t *testing.T, b []byte) ([]byte, []rec) {
	t.Helper()
	if len(b) < 12 || string(b[:8]) != "RUNNERCK" || binary.BigEndian.Uint32(b[8:12]) != 1 {
		t.Fatalf("archive header %q", b[:min(len(b), 12)])
	}
	var recs []rec
	for p := b[12:]; len(p) > 0; {
		n := binary.BigEndian.Uint32(p[1:5])
		recs = append(recs, rec{p[0], p[5 : 5+n]})
		p = p[5+n:]
	}
	if len(recs) < 2 || recs[0].kind != 1 || recs[len(recs)-1].kind != 3 {
		t.Fatalf("records %d, want a snapshot first and an end last", len(recs))
	}
	return b[:12], recs
}

// buildArchive writes head and recs; with fixEnd the end record is
// recomputed (chunk count, bytes before it, CRC-32C of them), so only the
// check a case aims at can catch it.
func buildArchive(head []byte, recs []rec, fixEnd bool) []byte {
	var b bytes.Buffer
	b.Write(head)
	chunks := 0
	for _, r := range recs {
		if r.kind == 3 && fixEnd {
			var end [20]byte
			binary.BigEndian.PutUint64(end[0:], uint64(chunks))
			binary.BigEndian.PutUint64(end[8:], uint64(b.Len()))
			binary.BigEndian.PutUint32(end[16:], crc32.Checksum(b.Bytes(), crc32.MakeTable(crc32.Castagnoli)))
			r.payload = end[:]
		}
		if r.kind == 2 {
			chunks++
		}
		var h [5]byte
		h[0] = r.kind
		binary.BigEndian.PutUint32(h[1:], uint32(len(r.payload)))
		b.Write(h[:])
		b.Write(r.payload)
	}
	return b.Bytes()
}

func readSnapshotRec(t *testing.T, r rec) arcSnapshot {
	t.Helper()
	dec, _ := zstd.NewReader(nil)
	defer dec.Close()
	js, err := dec.DecodeAll(r.payload[32:], nil)
	if err != nil {
		t.Fatal(err)
	}
	if sum := sha256.Sum256(js); !bytes.Equal(sum[:], r.payload[:32]) {
		t.Fatal("snapshot hash differs")
	}
	var a arcSnapshot
	if err := json.Unmarshal(js, &a); err != nil {
		t.Fatal(err)
	}
	return a
}

func snapshotRec(t *testing.T, a arcSnapshot) rec {
	t.Helper()
	js, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	enc, _ := zstd.NewWriter(nil)
	defer enc.Close()
	sum := sha256.Sum256(js)
	return rec{1, append(sum[:], enc.EncodeAll(js, nil)...)}
}

func chunkRec(plain, frame []byte) rec {
	sum := sha256.Sum256(plain)
	return rec{2, append(sum[:], frame...)}
}

func export(t *testing.T, s *checkpoint.Store, id string, have func(string) bool) []byte {
	t.Helper()
	var b bytes.Buffer
	n, err := s.Export(context.Background(), id, &b, have)
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(b.Len()) {
		t.Errorf("Export returned %d bytes, wrote %d", n, b.Len())
	}
	return b.Bytes()
}

// storeState is everything of a store an import must leave unchanged when
// it fails: its index and the names and bytes of every other file.
func storeState(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(dir, p)
			sum := sha256.Sum256(b)
			out = append(out, rel+" "+hex.EncodeToString(sum[:8]))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestExportImportRoundTrip: a checkpoint exported from one store,
// imported into another and restored there is the tree it was made from:
// bytes, modes, owners, symlinks, mtimes; the Info is the same; a second
// import of the same archive changes nothing.
func TestExportImportRoundTrip(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	ws := filepath.Join(base, "ws")
	sample(t, ws)
	want := listing(t, ws)
	a := open(t, filepath.Join(base, "a"))
	info, err := a.Create(ctx, []string{ws}, checkpoint.Options{Comment: "moved"})
	if err != nil {
		t.Fatal(err)
	}
	arc := export(t, a, info.ID, nil)

	bdir := filepath.Join(base, "b")
	b := open(t, bdir)
	got, err := b.Import(ctx, bytes.NewReader(arc))
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != info.ID || got.Comment != info.Comment || !got.Created.Equal(info.Created) ||
		got.Size != info.Size || got.Files != info.Files || got.Skipped != info.Skipped || got.Frozen != info.Frozen {
		t.Errorf("imported Info = %+v, want %+v (Stored aside)", got, info)
	}
	if l, _ := b.List(); len(l) != 1 || l[0] != got {
		t.Errorf("List after import = %+v, want [%+v]", l, got)
	}
	if usage, _ := b.DiskUsage(); got.Stored <= 0 || got.Stored > usage {
		t.Errorf("imported Stored = %d, the store uses %d", got.Stored, usage)
	}
	ca, cb := chunkFiles(t, filepath.Join(base, "a")), chunkFiles(t, bdir)
	for i := range ca {
		ca[i] = filepath.Base(ca[i])
	}
	for i := range cb {
		cb[i] = filepath.Base(cb[i])
	}
	if !slices.Equal(ca, cb) {
		t.Errorf("chunks after import %v, want the exporter's %v", cb, ca)
	}

	state := storeState(t, bdir)
	// Import reads the archive's bytes and not one more: what follows on
	// the stream is the caller's.
	r := &countingReader{r: io.MultiReader(bytes.NewReader(arc), strings.NewReader("after the archive"))}
	again, err := b.Import(ctx, r)
	if r.n != len(arc) {
		t.Errorf("Import read %d bytes of a %d-byte archive", r.n, len(arc))
	}
	if err != nil || again != got {
		t.Errorf("second import = %+v, %v; want %+v, nil", again, err, got)
	}
	if s := storeState(t, bdir); !slices.Equal(s, state) {
		t.Errorf("second import changed the store:\n%s\nwant:\n%s", strings.Join(s, "\n"), strings.Join(state, "\n"))
	}

	target := filepath.Join(base, "elsewhere")
	if err := b.Restore(ctx, got.ID, []string{target}); err != nil {
		t.Fatal(err)
	}
	if l := listing(t, target); !slices.Equal(l, want) {
		t.Errorf("restored import:\n%s\nwant:\n%s", strings.Join(l, "\n"), strings.Join(want, "\n"))
	}

	// An export of the imported checkpoint is the same archive.
	if re := export(t, b, got.ID, nil); !bytes.Equal(re, arc) {
		t.Errorf("export of the imported checkpoint differs from the original archive (%d vs %d bytes)", len(re), len(arc))
	}
	if _, err := a.Export(ctx, "ck-0000000000000000", &bytes.Buffer{}, nil); !errors.Is(err, checkpoint.ErrUnknown) {
		t.Errorf("Export of an unknown id = %v, want ErrUnknown", err)
	}
}

// TestIncrementalExport: after one new 1 MiB file, the archive of the
// second checkpoint for a receiver holding the first is under 2 MiB,
// imports there, and is refused (ErrCorrupt, nothing kept) by a store
// that lacks the first.
func TestIncrementalExport(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	ws := filepath.Join(base, "ws")
	for i := range 40 {
		write(t, filepath.Join(ws, "d", string(rune('a'+i%26))+string(rune('a'+i/26))), random(uint64(i), 256<<10), 0o644)
	}
	a := open(t, filepath.Join(base, "a"))
	first, err := a.Create(ctx, []string{ws}, checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	full := export(t, a, first.ID, nil)
	b := open(t, filepath.Join(base, "b"))
	if _, err := b.Import(ctx, bytes.NewReader(full)); err != nil {
		t.Fatal(err)
	}

	write(t, filepath.Join(ws, "changed"), random(200, 1<<20), 0o644)
	want := listing(t, ws)
	second, err := a.Create(ctx, []string{ws}, checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	have, err := a.Chunks(first.ID)
	if err != nil {
		t.Fatal(err)
	}
	inc := export(t, a, second.ID, have)
	t.Logf("full archive %d bytes, incremental %d bytes", len(full), len(inc))
	if len(inc) > 2<<20 || len(inc) < 1<<20 {
		t.Errorf("incremental archive after a 1 MiB change: %d bytes, want between 1 and 2 MiB", len(inc))
	}
	// The receiver's own answer gives the same archive.
	if inc2 := export(t, a, second.ID, b.HasChunk); !bytes.Equal(inc2, inc) {
		t.Errorf("export with the receiver's HasChunk: %d bytes, with the base's chunks %d", len(inc2), len(inc))
	}

	cdir := filepath.Join(base, "c")
	c := open(t, cdir)
	state := storeState(t, cdir)
	if _, err := c.Import(ctx, bytes.NewReader(inc)); !errors.Is(err, checkpoint.ErrCorrupt) {
		t.Errorf("incremental import into a store without its base = %v, want ErrCorrupt", err)
	}
	if s := storeState(t, cdir); !slices.Equal(s, state) {
		t.Errorf("refused import changed the store: %v", s)
	}

	got, err := b.Import(ctx, bytes.NewReader(inc))
	if err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(base, "target")
	if err := b.Restore(ctx, got.ID, []string{target}); err != nil {
		t.Fatal(err)
	}
	if l := listing(t, target); !slices.Equal(l, want) {
		t.Errorf("restored incremental import differs")
	}
}

// TestParallelCreateSameChunks: a Create on one worker and one on eight
// make the same snapshot, and every file's chunk ids are the ones the
// restic chunker with the store's polynomial and SHA-256 give when run on
// the file by hand: the format did not change with the pipeline.
func TestParallelCreateSameChunks(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	ws := filepath.Join(base, "ws")
	sample(t, ws)
	for i := range 12 {
		write(t, filepath.Join(ws, "many", string(rune('a'+i))), random(uint64(10+i), (i+1)*300<<10), 0o644)
	}
	write(t, filepath.Join(ws, "dup1"), random(7, 2<<20), 0o644) // the same chunks twice
	write(t, filepath.Join(ws, "dup2"), random(7, 2<<20), 0o644)
	snaps := map[int][]byte{}
	for _, n := range []int{1, 8} {
		undo := checkpoint.SetParallel(n)
		dir := filepath.Join(base, "store", string(rune('0'+n)))
		s, err := checkpoint.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Create(ctx, []string{ws}, checkpoint.Options{})
		undo()
		s.Close()
		if err != nil {
			t.Fatal(err)
		}
		var sn struct {
			Trees json.RawMessage `json:"trees"`
		}
		b, _ := os.ReadFile(filepath.Join(dir, "snapshots", info.ID+".json"))
		if err := json.Unmarshal(b, &sn); err != nil {
			t.Fatal(err)
		}
		snaps[n] = sn.Trees
	}
	if !bytes.Equal(snaps[1], snaps[8]) {
		t.Fatalf("trees differ between 1 and 8 workers:\n%s\n%s", snaps[1], snaps[8])
	}
	var trees [][]struct {
		Path   string   `json:"p"`
		Chunks []string `json:"c"`
	}
	json.Unmarshal(snaps[8], &trees)
	files := 0
	for _, e := range trees[0] {
		fi, err := os.Lstat(filepath.Join(ws, e.Path))
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		files++
		if want := handChunks(t, filepath.Join(ws, e.Path)); !slices.Equal(e.Chunks, want) {
			t.Errorf("%s: chunks %v, by hand %v", e.Path, e.Chunks, want)
		}
	}
	if files != 19 {
		t.Errorf("compared %d files, want 19", files)
	}
}

// TestImportRefusesDamage: every kind of damaged or hostile archive is
// refused with ErrCorrupt and leaves the receiving store exactly as it
// was (a checkpoint it held is still listed and whole), also after a
// recovering Open.
func TestImportRefusesDamage(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	ws := filepath.Join(base, "ws")
	sample(t, ws)
	a := open(t, filepath.Join(base, "a"))
	info, err := a.Create(ctx, []string{ws}, checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	good := export(t, a, info.ID, nil)
	head, recs := parseArchive(t, good)
	sn := readSnapshotRec(t, recs[0])
	enc, _ := zstd.NewWriter(nil)
	defer enc.Close()

	with := func(f func(recs []rec) []rec) []byte {
		return buildArchive(head, f(slices.Clone(recs)), true)
	}
	withTree := func(f func(a *arcSnapshot)) []byte {
		c := sn
		b, _ := json.Marshal(sn)
		json.Unmarshal(b, &c) // deep copy
		f(&c)
		return with(func(r []rec) []rec { r[0] = snapshotRec(t, c); return r })
	}
	over := func(kind byte, n uint32, prefix []byte, body int) []byte {
		b := slices.Clone(prefix)
		var h [5]byte
		h[0] = kind
		binary.BigEndian.PutUint32(h[1:], n)
		return append(append(b, h[:]...), make([]byte, body)...)
	}
	afterSnap := buildArchive(head, recs[:1], false)
	firstChunk := slices.IndexFunc(recs, func(r rec) bool { return r.kind == 2 })
	// A chunk whose frame is valid zstd of other bytes than its name.
	plain, _ := zstd.NewReader(nil)
	defer plain.Close()
	orig, err := plain.DecodeAll(recs[firstChunk].payload[32:], nil)
	if err != nil {
		t.Fatal(err)
	}
	flipped := slices.Clone(orig)
	flipped[len(flipped)/2] ^= 1

	cases := []struct {
		name string
		arc  []byte
	}{
		{"empty", nil},
		{"not an archive", []byte("hello, this is not a checkpoint archive")},
		{"version 2", func() []byte { b := slices.Clone(good); b[11] = 2; return b }()},
		{"version 0", func() []byte { b := slices.Clone(good); b[11] = 0; return b }()},
		{"chunk content not its hash", with(func(r []rec) []rec {
			r[firstChunk] = rec{2, append(slices.Clone(r[firstChunk].payload[:32]), enc.EncodeAll(flipped, nil)...)}
			return r
		})},
		{"chunk frame garbage", with(func(r []rec) []rec {
			p := slices.Clone(r[firstChunk].payload)
			for i := 40; i < len(p); i += 7 {
				p[i] ^= 0x55
			}
			r[firstChunk] = rec{2, p}
			return r
		})},
		{"chunk missing", with(func(r []rec) []rec { return slices.Delete(r, firstChunk, firstChunk+1) })},
		{"chunk twice", with(func(r []rec) []rec { return slices.Insert(r, firstChunk, r[firstChunk]) })},
		{"chunk not named", with(func(r []rec) []rec {
			extra := random(77, 1000)
			return slices.Insert(r, firstChunk, chunkRec(extra, enc.EncodeAll(extra, nil)))
		})},
		{"unknown record kind", with(func(r []rec) []rec { return slices.Insert(r, 1, rec{9, []byte("x")}) })},
		{"two snapshots", with(func(r []rec) []rec { return slices.Insert(r, 1, r[0]) })},
		{"no snapshot", with(func(r []rec) []rec { return r[1:] })},
		{"end record wrong", buildArchive(head, func() []rec {
			r := slices.Clone(recs)
			e := slices.Clone(r[len(r)-1].payload)
			e[19] ^= 1 // the CRC
			r[len(r)-1] = rec{3, e}
			return r
		}(), false)},
		{"end record of the wrong length", buildArchive(head, append(slices.Clone(recs[:len(recs)-1]), rec{3, make([]byte, 21)}), false)},
		{"snapshot hash wrong", with(func(r []rec) []rec {
			p := slices.Clone(r[0].payload)
			p[0] ^= 1
			r[0] = rec{1, p}
			return r
		})},
		{"info size wrong", withTree(func(a *arcSnapshot) { a.Size++ })},
		{"bad id", withTree(func(a *arcSnapshot) { a.ID = "../../../etc/x" })},
		{"path escapes", withTree(func(a *arcSnapshot) { a.Trees[0][1].Path = "../escape" })},
		{"absolute path", withTree(func(a *arcSnapshot) { a.Trees[0][1].Path = "/etc/escape" })},
		{"path twice", withTree(func(a *arcSnapshot) { a.Trees[0] = append(a.Trees[0], a.Trees[0][1]) })},
		{"no root", withTree(func(a *arcSnapshot) { a.Trees[0] = a.Trees[0][1:] })},
		{"unknown type", withTree(func(a *arcSnapshot) { a.Trees[0][1].Type = "fifo" })},
		{"mode bits beyond 07777", withTree(func(a *arcSnapshot) { a.Trees[0][1].Mode |= 0o170000 })},
	}
	// Length fields that claim more than the limits are refused as read,
	// before any of the payload (which is there) is.
	limits := []struct {
		name   string
		arc    []byte
		prefix int
	}{
		{"snapshot length over the limit", over(1, 32+checkpoint.MaxSnapshot+1, head, 32+checkpoint.MaxSnapshot+1), len(head)},
		{"snapshot length 4 GiB", over(1, 0xffffffff, head, 64), len(head)},
		{"chunk length over the limit", over(2, 32+checkpoint.MaxFrame+1, afterSnap, 32+checkpoint.MaxFrame+1), len(afterSnap)},
		{"chunk length 4 GiB", over(2, 0xffffffff, afterSnap, 64), len(afterSnap)},
	}
	// Truncated anywhere: in the header, in a record's head, in a payload,
	// before the end record, in it.
	for _, cut := range []int{3, 12, 14, 17, 40, len(recs[0].payload) + 12 + 5, len(good) / 2, len(good) - 21, len(good) - 25, len(good) - 1} {
		cases = append(cases, struct {
			name string
			arc  []byte
		}{"truncated at " + strconv.Itoa(cut), good[:cut]})
	}

	bdir := filepath.Join(base, "b")
	b := open(t, bdir)
	ws2 := filepath.Join(base, "ws2")
	write(t, filepath.Join(ws2, "kept"), []byte("kept"), 0o644)
	kept, err := b.Create(ctx, []string{ws2}, checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	state := storeState(t, bdir)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := b.Import(ctx, bytes.NewReader(tc.arc))
			if !errors.Is(err, checkpoint.ErrCorrupt) {
				t.Fatalf("Import = %v, want ErrCorrupt", err)
			}
			t.Logf("refused: %v", err)
			if s := storeState(t, bdir); !slices.Equal(s, state) {
				t.Fatalf("refused import changed the store:\n%s\nwant:\n%s", strings.Join(s, "\n"), strings.Join(state, "\n"))
			}
		})
	}
	for _, tc := range limits {
		t.Run(tc.name, func(t *testing.T) {
			r := &countingReader{r: bytes.NewReader(tc.arc)}
			_, err := b.Import(ctx, r)
			if !errors.Is(err, checkpoint.ErrCorrupt) {
				t.Fatalf("Import = %v, want ErrCorrupt", err)
			}
			if r.n > tc.prefix+5 {
				t.Fatalf("Import read %d bytes before refusing, want at most %d (up to the length field)", r.n, tc.prefix+5)
			}
			if s := storeState(t, bdir); !slices.Equal(s, state) {
				t.Fatalf("refused import changed the store: %v", s)
			}
		})
	}
	b.Close()
	b = open(t, bdir)
	if l, _ := b.List(); len(l) != 1 || l[0].ID != kept.ID {
		t.Errorf("List after the refused imports = %+v, want only %s", l, kept.ID)
	}
	if s := storeState(t, bdir); !slices.Equal(s, state) {
		t.Errorf("store after a recovering Open:\n%s\nwant:\n%s", strings.Join(s, "\n"), strings.Join(state, "\n"))
	}
	// The good archive still imports: the refusals were the damage's.
	if _, err := b.Import(ctx, bytes.NewReader(good)); err != nil {
		t.Errorf("Import of the undamaged archive: %v", err)
	}
}

// TestImportSymlinkEscape: a hostile archive holds a symlink "l" to a
// directory outside and a file "l/planted" after it (and a variant with
// "../planted"). Import refuses it with ErrCorrupt; nothing is written
// outside the store, and no restore of it can happen. (Without checkTree
// the archive is accepted, and its restore writes planted through the
// link into the outside directory.)
func TestImportSymlinkEscape(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	if err := os.Mkdir(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	payload := []byte("planted by a hostile archive\n")
	sum := sha256.Sum256(payload)
	enc, _ := zstd.NewWriter(nil)
	defer enc.Close()
	file := arcEntry{Type: "file", Mode: 0o644, Size: int64(len(payload)), Chunks: []string{hex.EncodeToString(sum[:])}}
	for _, tc := range []struct {
		name string
		tree []arcEntry
	}{
		{"through a symlink", []arcEntry{
			{Path: ".", Type: "dir", Mode: 0o755},
			{Path: "l", Type: "symlink", Mode: 0o777, Target: outside},
			func() arcEntry { e := file; e.Path = "l/planted"; return e }(),
		}},
		{"dotdot", []arcEntry{
			{Path: ".", Type: "dir", Mode: 0o755},
			func() arcEntry { e := file; e.Path = "../outside/planted"; return e }(),
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := arcSnapshot{ID: "ck-00000000000000aa", Created: time.Now().UTC(), Size: int64(len(payload)), Files: 1, Trees: [][]arcEntry{tc.tree}}
			head := append([]byte("RUNNERCK"), 0, 0, 0, 1)
			arc := buildArchive(head, []rec{snapshotRec(t, a), chunkRec(payload, enc.EncodeAll(payload, nil)), {kind: 3}}, true)
			dir := filepath.Join(t.TempDir(), "store")
			s := open(t, dir)
			info, err := s.Import(ctx, bytes.NewReader(arc))
			if err == nil {
				// The defence is gone: show what it stops.
				rerr := s.Restore(ctx, info.ID, []string{filepath.Join(base, "ws-"+strings.ReplaceAll(tc.name, " ", "-"))})
				_, serr := os.Stat(filepath.Join(outside, "planted"))
				t.Fatalf("Import of a hostile tree accepted (restore: %v; planted outside: %v)", rerr, serr == nil)
			}
			if !errors.Is(err, checkpoint.ErrCorrupt) {
				t.Fatalf("Import = %v, want ErrCorrupt", err)
			}
			if l, _ := s.List(); len(l) != 0 {
				t.Errorf("List = %+v, want none", l)
			}
			if c := chunkFiles(t, dir); len(c) != 0 {
				t.Errorf("chunks kept: %v", c)
			}
			if e, _ := os.ReadDir(outside); len(e) != 0 {
				t.Errorf("written outside: %v", e)
			}
		})
	}
}

// TestImportBombsBounded: archives whose frames decompress to far more
// than the limits allow (a chunk of 1 GiB of zeros, a snapshot of 2 GiB
// of spaces, both a few KiB on the wire) are refused with ErrCorrupt,
// and the import allocates less than 64 MiB doing so (the decoder's
// window and one chunk's buffer per worker), not the claimed size.
func TestImportBombsBounded(t *testing.T) {
	ctx := context.Background()
	enc, _ := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedBestCompression))
	defer enc.Close()
	repeat := func(b []byte, n int) []byte {
		frame := enc.EncodeAll(b, nil)
		return bytes.Repeat(frame, n) // a zstd stream may hold many frames
	}
	head := append([]byte("RUNNERCK"), 0, 0, 0, 1)
	zeros := make([]byte, 8<<20)
	chunkBomb := repeat(zeros, 128) // 1 GiB
	id := sha256.Sum256(zeros)
	a := arcSnapshot{ID: "ck-00000000000000bb", Created: time.Now().UTC(), Size: 8 << 20, Files: 1,
		Trees: [][]arcEntry{{{Path: ".", Type: "dir", Mode: 0o755}, {Path: "z", Type: "file", Mode: 0o644, Size: 8 << 20, Chunks: []string{hex.EncodeToString(id[:])}}}}}
	spaces := bytes.Repeat([]byte(" "), 8<<20)
	snapBomb := repeat(spaces, 256) // 2 GiB
	jsSum := sha256.Sum256(nil)
	for _, tc := range []struct {
		name string
		arc  []byte
	}{
		{"chunk", buildArchive(head, []rec{snapshotRec(t, a), {2, append(id[:], chunkBomb...)}, {kind: 3}}, true)},
		{"snapshot", buildArchive(head, []rec{{1, append(jsSum[:], snapBomb...)}, {kind: 3}}, true)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := open(t, filepath.Join(t.TempDir(), "store"))
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err := s.Import(ctx, bytes.NewReader(tc.arc))
			runtime.ReadMemStats(&after)
			if !errors.Is(err, checkpoint.ErrCorrupt) {
				t.Fatalf("Import of a %d-byte bomb = %v, want ErrCorrupt", len(tc.arc), err)
			}
			alloc := after.TotalAlloc - before.TotalAlloc
			t.Logf("%d-byte archive refused (%v) after allocating %d MiB", len(tc.arc), err, alloc>>20)
			if limit := uint64(64 << 20); alloc > limit {
				t.Errorf("allocated %d MiB refusing a bomb, want at most %d MiB", alloc>>20, limit>>20)
			}
		})
	}
}

// TestKillDuringImportConverges: the importing process is killed (SIGKILL)
// after its first chunk is written, after all of them, after the
// snapshot, and after the index; the next Open lists the checkpoint only
// in the last case (whole: it restores) and otherwise keeps no chunk and
// no snapshot of it.
func TestKillDuringImportConverges(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	ws := filepath.Join(base, "ws")
	sample(t, ws)
	want := listing(t, ws)
	a := open(t, filepath.Join(base, "a"))
	info, err := a.Create(ctx, []string{ws}, checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	arcPath := filepath.Join(base, "archive")
	if err := os.WriteFile(arcPath, export(t, a, info.ID, nil), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, step := range []string{"import-chunk", "import-chunks", "import-snapshot", "import-index"} {
		t.Run(step, func(t *testing.T) {
			store := filepath.Join(t.TempDir(), "store")
			crashAt(t, crashSpec{Op: "import", Step: step, Store: store, Root: arcPath})
			s := open(t, store)
			l, err := s.List()
			if err != nil {
				t.Fatal(err)
			}
			if step != "import-index" {
				if len(l) != 0 {
					t.Errorf("List = %+v, want none", l)
				}
				if c := chunkFiles(t, store); len(c) != 0 {
					t.Errorf("%d chunk files kept after Open", len(c))
				}
				if snaps, _ := os.ReadDir(filepath.Join(store, "snapshots")); len(snaps) != 0 {
					t.Errorf("snapshots kept: %v", snaps)
				}
				if _, err := os.Stat(filepath.Join(store, "dirty")); err == nil {
					t.Error("dirty kept after Open")
				}
				// The import can be done again, whole.
				f, _ := os.Open(arcPath)
				defer f.Close()
				if _, err := s.Import(ctx, f); err != nil {
					t.Fatalf("import after recovery: %v", err)
				}
			} else if len(l) != 1 || l[0].ID != info.ID {
				t.Fatalf("List = %+v, want %s", l, info.ID)
			}
			target := filepath.Join(t.TempDir(), "ws")
			if err := s.Restore(ctx, info.ID, []string{target}); err != nil {
				t.Fatal(err)
			}
			if got := listing(t, target); !slices.Equal(got, want) {
				t.Errorf("restored import differs")
			}
		})
	}
}

// handChunks cuts file p with the restic chunker and the store's
// polynomial and names each chunk by its SHA-256.
func handChunks(t *testing.T, p string) []string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var ids []string
	ch := chunker.New(f, checkpoint.Pol)
	buf := make([]byte, chunker.MaxSize)
	for {
		c, err := ch.Next(buf)
		if err == io.EOF {
			return ids
		}
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(c.Data)
		ids = append(ids, hex.EncodeToString(sum[:]))
	}
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}
