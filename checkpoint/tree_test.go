package checkpoint_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agentrunner/runner/checkpoint"
)

// TestRestoreRefusesTreeThroughItsSymlink: a stored snapshot edited to
// hold a symlink to a directory outside and a file below that symlink (a
// tree Create never makes, but one a damaged store or an importer without
// checks could hold) is refused by Restore with ErrCorrupt, the sandbox's
// disk unchanged and nothing written outside. (Without checkTree in the
// restore, the file is written through the link into the outside
// directory.)
func TestRestoreRefusesTreeThroughItsSymlink(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	ws, outside := filepath.Join(base, "ws"), filepath.Join(base, "outside")
	sample(t, ws)
	if err := os.Mkdir(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	store := filepath.Join(base, "store")
	s := open(t, store)
	info, err := s.Create(ctx, []string{ws}, checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(store, "snapshots", info.ID+".json")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var sn struct {
		Info  json.RawMessage    `json:"info"`
		Trees [][]map[string]any `json:"trees"`
	}
	if err := json.Unmarshal(b, &sn); err != nil {
		t.Fatal(err)
	}
	tree := sn.Trees[0]
	link := slices.IndexFunc(tree, func(e map[string]any) bool { return e["p"] == "bin/link" })
	file := slices.IndexFunc(tree, func(e map[string]any) bool { return e["p"] == "a.txt" })
	if link < 0 || file < 0 {
		t.Fatalf("sample tree lacks bin/link or a.txt: %v", tree)
	}
	tree[link]["l"] = outside
	planted := map[string]any{}
	for k, v := range tree[file] {
		planted[k] = v
	}
	planted["p"] = "bin/link/planted"
	sn.Trees[0] = slices.Insert(tree, link+1, planted)
	if b, err = json.Marshal(sn); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}

	want := listing(t, ws)
	err = s.Restore(ctx, info.ID, []string{ws})
	if e, _ := os.ReadDir(outside); len(e) != 0 {
		t.Errorf("restore wrote outside its tree: %v", e)
	}
	if !errors.Is(err, checkpoint.ErrCorrupt) {
		t.Fatalf("Restore of a tree through its own symlink = %v, want ErrCorrupt", err)
	}
	if got := listing(t, ws); !slices.Equal(got, want) {
		t.Errorf("disk changed by a refused restore:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
