package daemon_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/agentrunner/runner/checkpoint"
	"github.com/agentrunner/runner/wire"
)

// archiveRunnerds starts two real runnerds (A and B: own state, cgroup
// root and processes; one claim directory, so their sandboxes get
// different uids) that both advertise checkpoints.
func archiveRunnerds(t *testing.T) (a, b *api) {
	t.Helper()
	needV1Cgroups(t)
	claims := t.TempDir()
	a, _ = startRunnerdProc(t, nil, passableTempDir(t), "", "--claim-dir", claims)
	b, _ = startRunnerdProc(t, nil, passableTempDir(t), "", "--claim-dir", claims)
	for _, d := range []*api{a, b} {
		if !slices.Contains(d.capabilities(), wire.CapCheckpoint) {
			t.Fatalf("capabilities %v: no %s on a root host with the freezer", d.capabilities(), wire.CapCheckpoint)
		}
	}
	return a, b
}

// raw sends body as is (nil: none) and returns the answer whole.
func (a *api) raw(method, path string, body io.Reader) response {
	a.t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), method, a.base+path, body)
	if err != nil {
		a.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	if body != nil {
		req.Header.Set("Content-Type", wire.ContentTypeCheckpointArchive)
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		a.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		a.t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

// export fetches checkpoint id of sandbox as an archive (base: incremental).
func (a *api) export(sandbox, id, base string) []byte {
	a.t.Helper()
	q := ""
	if base != "" {
		q = "?" + wire.QueryArchiveBase + "=" + base
	}
	r := a.raw("GET", "/v1/sandboxes/"+sandbox+"/checkpoints/"+id+"/archive"+q, nil)
	if r.status != 200 || r.header.Get("Content-Type") != wire.ContentTypeCheckpointArchive {
		a.t.Fatalf("export %s/%s: got %d %q %.200q, want 200 %s", sandbox, id, r.status, r.header.Get("Content-Type"), r.body, wire.ContentTypeCheckpointArchive)
	}
	return r.body
}

// importArchive posts arc into sandbox's checkpoints and wants status.
func (a *api) importArchive(sandbox string, arc []byte, status int) wire.Checkpoint {
	a.t.Helper()
	r := a.raw("POST", "/v1/sandboxes/"+sandbox+"/checkpoints/import", bytes.NewReader(arc))
	if r.status != status {
		a.t.Fatalf("import into %s: got %d %s, want %d", sandbox, r.status, r.body, status)
	}
	var ck wire.Checkpoint
	if err := json.Unmarshal(r.body, &ck); err != nil {
		a.t.Fatalf("import into %s: decode %q: %v", sandbox, r.body, err)
	}
	return ck
}

func (a *api) checkpointIDs(sandbox string) []string {
	a.t.Helper()
	var list wire.Checkpoints
	a.must("GET", "/v1/sandboxes/"+sandbox+"/checkpoints", nil, 200, &list)
	ids := []string{}
	for _, c := range list.Checkpoints {
		ids = append(ids, c.ID)
	}
	return ids
}

// treeOf lists root's entries: path, mode (type and permission bits,
// setuid included), symlink target, content hash; owners apart.
func treeOf(t *testing.T, root string) (tree string, owners map[string][2]uint32) {
	t.Helper()
	var b strings.Builder
	owners = map[string][2]uint32{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		owners[rel] = [2]uint32{st.Uid, st.Gid}
		fmt.Fprintf(&b, "%s %v", rel, fi.Mode())
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			l, err := os.Readlink(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(&b, " -> %s", l)
		case fi.Mode().IsRegular():
			c, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(&b, " %d %x", len(c), sha256.Sum256(c))
		}
		b.WriteByte('\n')
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String(), owners
}

// sandboxOwner is who the files of sb's workspace belong to.
func sandboxOwner(t *testing.T, sb wire.Sandbox) [2]uint32 {
	t.Helper()
	if sb.UID != nil {
		return [2]uint32{*sb.UID, *sb.GID}
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(sb.WorkspaceOnHost(), &st); err != nil {
		t.Fatal(err)
	}
	return [2]uint32{st.Uid, st.Gid}
}

// TestCheckpointArchiveBetweenRunnerds (#40): a sandbox's checkpoint on
// runnerd A exported, imported into a sandbox of runnerd B and restored
// there gives the same bytes, modes and symlinks, every entry owned by
// B's sandbox; the import answers 201 then 200 for the same archive; an
// incremental export after a 1 MiB change is at most 2 MiB and B takes
// it; a sandbox of B without the base refuses that archive,
// restore_failed, its list unchanged; refusals before the stream are the
// taxonomy's (unknown id or base invalid, unknown sandbox not_found).
func TestCheckpointArchiveBetweenRunnerds(t *testing.T) {
	a, b := archiveRunnerds(t)
	a.createSandbox("mover")
	a.run("mover", "sh", "-c", `set -e
mkdir -p src/deep bin; chmod 0750 src/deep
head -c 3000000 /dev/urandom > src/big.bin
printf 'one\000two' > src/deep/nul; chmod 0600 src/deep/nul
printf '#!/bin/sh\necho hi\n' > bin/tool; chmod 0755 bin/tool
ln -s ../src/big.bin bin/link; ln -s /etc/passwd bin/abs; ln -s nowhere dangling
for i in $(seq 1 20); do head -c 200000 /dev/urandom > src/f$i; done`)
	sbA := a.createSandbox("mover")
	var ck1 wire.Checkpoint
	a.must("POST", "/v1/sandboxes/mover/checkpoints", wire.CreateCheckpoint{Comment: "to B"}, 201, &ck1)
	full := a.export("mover", ck1.ID, "")

	sbB := b.createSandbox("mover")
	if sbA.UID != nil && sbB.UID != nil && *sbA.UID == *sbB.UID {
		t.Fatalf("both sandboxes run as uid %d: the owner remap would go unseen", *sbA.UID)
	}
	b.run("mover", "sh", "-c", "echo B-only > mine")
	got := b.importArchive("mover", full, 201)
	if got.ID != ck1.ID || got.Comment != "to B" || got.Size != ck1.Size || got.Files != ck1.Files || got.Sandbox != "mover" {
		t.Fatalf("imported %+v, want the id, comment, size and files of %+v", got, ck1)
	}
	if again := b.importArchive("mover", full, 200); again.ID != ck1.ID || again.StoredBytes != got.StoredBytes {
		t.Errorf("second import answered %+v, want %+v", again, got)
	}
	b.must("POST", "/v1/sandboxes/mover/checkpoints/"+ck1.ID+"/restore", nil, 200, nil)
	wantTree, _ := treeOf(t, sbA.WorkspaceOnHost())
	gotTree, owners := treeOf(t, sbB.WorkspaceOnHost())
	if gotTree != wantTree {
		t.Errorf("B's restored tree:\n%s\nwant A's:\n%s", gotTree, wantTree)
	}
	own := sandboxOwner(t, sbB)
	for p, o := range owners {
		if o != own {
			t.Errorf("B's %s owned by %v, want B's sandbox %v", p, o, own)
		}
	}
	if out := b.run("mover", "sh", "-c", "cat src/deep/nul; sh bin/tool; echo x >> src/f1 && echo writable"); out != "one\x00twohi\nwritable" {
		t.Errorf("B's sandbox reads %q", out)
	}

	// Incremental: 1 MiB more on A; the archive against ck1 is that.
	a.run("mover", "sh", "-c", "head -c 1048576 /dev/urandom > src/new.bin")
	var ck2 wire.Checkpoint
	a.must("POST", "/v1/sandboxes/mover/checkpoints", nil, 201, &ck2)
	inc := a.export("mover", ck2.ID, ck1.ID)
	t.Logf("full archive %d bytes, incremental after 1 MiB %d bytes", len(full), len(inc))
	if len(inc) > 2<<20 {
		t.Errorf("incremental archive after a 1 MiB change is %d bytes, want <= %d", len(inc), 2<<20)
	}
	b.createSandbox("fresh")
	b.wantError(b.raw("POST", "/v1/sandboxes/fresh/checkpoints/import", bytes.NewReader(inc)), 500, wire.CodeRestoreFailed)
	if ids := b.checkpointIDs("fresh"); len(ids) != 0 {
		t.Errorf("a refused import left checkpoints %v", ids)
	}
	b.importArchive("mover", inc, 201)
	b.must("POST", "/v1/sandboxes/mover/checkpoints/"+ck2.ID+"/restore", nil, 200, nil)
	wantTree, _ = treeOf(t, sbA.WorkspaceOnHost())
	if gotTree, _ = treeOf(t, sbB.WorkspaceOnHost()); gotTree != wantTree {
		t.Errorf("B after the incremental restore:\n%s\nwant:\n%s", gotTree, wantTree)
	}

	a.wantError(a.raw("GET", "/v1/sandboxes/mover/checkpoints/ck-0000000000000000/archive", nil), 400, wire.CodeInvalid)
	a.wantError(a.raw("GET", "/v1/sandboxes/mover/checkpoints/"+ck2.ID+"/archive?base=ck-0000000000000000", nil), 400, wire.CodeInvalid)
	a.wantError(a.raw("GET", "/v1/sandboxes/nosuch/checkpoints/"+ck2.ID+"/archive", nil), 404, wire.CodeNotFound)
	b.wantError(b.raw("POST", "/v1/sandboxes/nosuch/checkpoints/import", bytes.NewReader(full)), 404, wire.CodeNotFound)
}

// TestCheckpointArchiveCorruptRefused: an archive with one byte flipped
// anywhere (header, snapshot, chunk, end record) or cut short is refused
// restore_failed, and B's checkpoints and chunks are as before.
func TestCheckpointArchiveCorruptRefused(t *testing.T) {
	a, b := archiveRunnerds(t)
	a.createSandbox("src")
	a.run("src", "sh", "-c", "head -c 2000000 /dev/urandom > data; echo small > s")
	var ck wire.Checkpoint
	a.must("POST", "/v1/sandboxes/src/checkpoints", nil, 201, &ck)
	arc := a.export("src", ck.ID, "")

	b.createSandbox("dst")
	b.run("dst", "sh", "-c", "echo mine > f")
	var own wire.Checkpoint
	b.must("POST", "/v1/sandboxes/dst/checkpoints", nil, 201, &own)
	store := filepath.Join(b.state, "checkpoints", "dst")
	before := dirListing(t, store)
	cases := []struct {
		name string
		arc  []byte
	}{
		{"magic", flip(arc, 0)},
		{"version", flip(arc, 11)},
		{"snapshot", flip(arc, 60)},
		{"chunk", flip(arc, len(arc)/2)},
		{"end record", flip(arc, len(arc)-3)},
		{"truncated", arc[:len(arc)*2/3]},
		{"no end record", arc[:len(arc)-25]},
		{"empty", []byte{}},
	}
	for _, tc := range cases {
		b.wantError(b.raw("POST", "/v1/sandboxes/dst/checkpoints/import", bytes.NewReader(tc.arc)), 500, wire.CodeRestoreFailed)
		if ids := b.checkpointIDs("dst"); !slices.Equal(ids, []string{own.ID}) {
			t.Errorf("%s: B lists %v after the refused import, want [%s]", tc.name, ids, own.ID)
		}
		if after := dirListing(t, store); after != before {
			t.Errorf("%s: B's store changed:\n%s\nwant:\n%s", tc.name, after, before)
		}
	}
	b.importArchive("dst", arc, 201) // the intact one is taken
}

func flip(b []byte, i int) []byte {
	c := bytes.Clone(b)
	c[i] ^= 0x40
	return c
}

// dirListing is every path under dir with its size.
func dirListing(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if !d.IsDir() && rel != "index.json" {
			fmt.Fprintf(&b, "%s %d\n", rel, fi.Size())
		} else {
			fmt.Fprintf(&b, "%s\n", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestHostileArchiveOwners: a peer's archive naming a setuid-root program,
// a setgid file of group 0 and files of other uids (one of them another
// sandbox's on this host, as far as the peer knows) is restored with
// every entry owned by the receiving sandbox and no setuid or setgid bit
// on a file. Kept as they came (Store.Import), a root lchown and chmod
// at restore planted a setuid-root shell in the sandbox.
func TestHostileArchiveOwners(t *testing.T) {
	_, b := archiveRunnerds(t)
	src := t.TempDir()
	mk := func(rel string, mode fs.FileMode, uid, gid int) {
		p := filepath.Join(src, rel)
		if err := os.WriteFile(p, []byte("#!/bin/sh\nid\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(p, uid, gid); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	mk("rootshell", 0o755|fs.ModeSetuid, 0, 0)
	mk("groupie", 0o755|fs.ModeSetgid, 4242, 0)
	mk("other", 0o644, 1880000001, 1880000001)
	if err := os.Mkdir(filepath.Join(src, "shared"), 0o775); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(src, "shared"), 0o775|fs.ModeSetgid); err != nil {
		t.Fatal(err)
	}
	st, err := checkpoint.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	info, err := st.Create(context.Background(), []string{src}, checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var arc bytes.Buffer
	if _, err := st.Export(context.Background(), info.ID, &arc, nil); err != nil {
		t.Fatal(err)
	}

	sb := b.createSandbox("victim")
	b.importArchive("victim", arc.Bytes(), 201)
	b.must("POST", "/v1/sandboxes/victim/checkpoints/"+info.ID+"/restore", nil, 200, nil)
	own := sandboxOwner(t, sb)
	_, owners := treeOf(t, sb.WorkspaceOnHost())
	for p, o := range owners {
		if o != own {
			t.Errorf("restored %s owned by %v, want the sandbox's %v", p, o, own)
		}
	}
	for rel, want := range map[string]fs.FileMode{"rootshell": 0o755, "groupie": 0o755, "other": 0o644,
		"shared": fs.ModeDir | 0o775 | fs.ModeSetgid} {
		fi, err := os.Lstat(filepath.Join(sb.WorkspaceOnHost(), rel))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("restored %s mode %v, want %v", rel, fi.Mode(), want)
		}
	}
}
