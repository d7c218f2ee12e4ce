package runner

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDocsNameFilesThatExist holds the docs' pointers into the code to
// the tree: every source path a page names (`daemon/sandboxes/network.go`,
// shim/launch/pool.go, ...) exists. Files move when packages are cut by
// role; a page that sends a reader to a file that is gone is wrong in a
// way nobody notices by reading it.
func TestDocsNameFilesThatExist(t *testing.T) {
	pages, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, "README.md")
	// A module-relative path of a Go or C source file, starting at one of
	// the module's top-level directories.
	var tops []string
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() && e.Name()[0] != '.' {
			tops = append(tops, regexp.QuoteMeta(e.Name()))
		}
	}
	re := regexp.MustCompile(`(?:^|[\s(\x60"'\[])((?:` + strings.Join(tops, "|") + `)/[A-Za-z0-9_./-]+\.(?:go|c|sh))\b`)
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllSubmatch(b, -1) {
			p := string(m[1])
			if _, err := os.Stat(p); err != nil {
				t.Errorf("%s names %s, which does not exist", page, p)
			}
		}
	}
}
