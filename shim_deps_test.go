package runner

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestSupervisorOnlyInBinaries: the supervisor (package shim) is a
// process, reached through its Main; only programs (package main: runnerd,
// runner-shim, the bench's profiling shim) import it. runnerd's library
// side starts and drives shims through shim/launch and reads their
// directories through shim/sessiondir.
func TestSupervisorOnlyInBinaries(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}{{"\t"}}{{.Name}}{{"\t"}}{{join .Deps " "}}`, "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	importers := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.SplitN(line, "\t", 3)
		if len(f) < 3 || !slices.Contains(strings.Fields(f[2]), module+"/shim") {
			continue
		}
		importers++
		if f[1] != "main" {
			t.Errorf("package %s (%s) depends on the supervisor %s/shim; use shim/launch or shim/sessiondir", f[0], f[1], module)
		}
	}
	if importers == 0 {
		t.Errorf("no package depends on %s/shim: the binaries must (is go list's output what this test reads?)", module)
	}
}
