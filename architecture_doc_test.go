package runner

import (
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestArchitectureDocMatchesImports holds docs/architecture.md's
// dependency picture to the code: for every row "pkg ──▶ deps" of it,
// each package of this module that pkg imports directly (outside pkg's
// own subpackages and internal/) is named among deps, and each module
// package named there is imported. A row that says "(stdlib only)" may
// name none. The doc's picture is what a reader trusts first; this keeps
// it drawn from the code.
func TestArchitectureDocMatchesImports(t *testing.T) {
	doc, err := os.ReadFile("docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	imports := map[string][]string{} // package (module-relative) → module packages it imports
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg, ok := strings.CutPrefix(f[0], module+"/")
		if !ok {
			continue
		}
		imports[pkg] = []string{}
		for _, imp := range f[1:] {
			if rel, ok := strings.CutPrefix(imp, module+"/"); ok {
				imports[pkg] = append(imports[pkg], rel)
			}
		}
	}
	isModulePkg := func(p string) bool { _, ok := imports[p]; return ok }
	row := regexp.MustCompile(`^([a-z0-9/]+)\s+──▶\s+(.*)$`)
	rows := 0
	for _, line := range strings.Split(string(doc), "\n") {
		m := row.FindStringSubmatch(line)
		if m == nil || !isModulePkg(m[1]) {
			continue
		}
		rows++
		pkg := m[1]
		// deps end where the description starts (two or more spaces).
		depsText := regexp.MustCompile(`\s{2,}`).Split(m[2], 2)[0]
		var listed []string
		for _, d := range strings.Split(depsText, ",") {
			d = strings.TrimSpace(d)
			if isModulePkg(d) {
				listed = append(listed, d)
			}
		}
		covered := func(imp string) bool {
			return slices.ContainsFunc(listed, func(d string) bool { return imp == d || strings.HasPrefix(imp, d+"/") })
		}
		for _, imp := range imports[pkg] {
			if strings.HasPrefix(imp, pkg+"/") || strings.HasPrefix(imp, "internal/") || imp == "version" || covered(imp) {
				continue
			}
			t.Errorf("docs/architecture.md: %s imports %s, which its row (%q) does not name", pkg, imp, strings.TrimSpace(depsText))
		}
		for _, d := range listed {
			if !slices.ContainsFunc(imports[pkg], func(imp string) bool { return imp == d || strings.HasPrefix(imp, d+"/") }) {
				t.Errorf("docs/architecture.md: %s's row names %s, which it does not import", pkg, d)
			}
		}
	}
	if rows < 10 {
		t.Fatalf("found %d package rows in docs/architecture.md's picture; the test reads lines \"pkg ──▶ deps  description\"", rows)
	}
}
