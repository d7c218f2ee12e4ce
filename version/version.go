// Package version names the build of runner's three binaries (runnerd,
// runner, runner-shim), so that /healthz, the daemon's start log, `runner
// version` and runner-shim's answers all say the same thing, and a client or
// a daemon can tell when the two ends were built apart.
//
// The version comes, in order, from the linker (install.sh passes
// -ldflags "-X github.com/agentrunner/runner/version.Version=...", because
// Go's own VCS stamping fails in a checkout owned by another user, the
// usual `sudo` case), from the main module's version when the binaries
// were built with `go install module@version`, or from the VCS state Go
// stamped into a build from a checkout; a build with none of these is
// "dev". A checkout's version has one form however it was built (go build
// per the README, or install.sh): the vX.Y.Z tag of a clean commit that
// has one, else "dev-" and the first 12 hex digits of the commit, and
// "-dirty" when the tree has changes (git status --porcelain: untracked
// files count, as for Go's vcs.modified). install.sh computes the same
// string from git, so one commit is one version and runner never warns
// "built apart" about two builds of it.
package version

import (
	"runtime/debug"
	"strings"
	"sync"
)

// Version is set at link time; empty means "work it out from the build info".
var Version string

var (
	once   sync.Once
	cached string
)

// String returns the version of this build. It never returns "".
func String() string {
	once.Do(func() { cached = resolve(Version, readBuildInfo) })
	return cached
}

func readBuildInfo() (*debug.BuildInfo, bool) { return debug.ReadBuildInfo() }

func resolve(linked string, info func() (*debug.BuildInfo, bool)) string {
	if linked != "" {
		return linked
	}
	bi, ok := info()
	if !ok {
		return "dev"
	}
	var rev string
	var modified bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	main := bi.Main.Version
	if main == "(devel)" {
		main = ""
	}
	if rev == "" {
		// go install module@version: the module's own version.
		if main != "" {
			return main
		}
		return "dev"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	// Built from a checkout. Go (1.24 and later) names it by a tag only
	// when the commit is exactly a clean vX.Y.Z tag; otherwise its
	// version is a pseudo-version ending in the revision, or has
	// +dirty. install.sh stamps the same rule from git (Canonical), so
	// one commit is one version whichever way it was built.
	if main != "" && !modified && !strings.HasSuffix(main, "+dirty") && !strings.HasSuffix(main, "-"+rev) {
		return main
	}
	v := "dev-" + rev
	if modified {
		v += "-dirty"
	}
	return v
}

// Skewed reports whether two versions name different builds in a way worth
// a warning: both are known (neither is "dev") and they differ.
func Skewed(a, b string) bool {
	return a != b && a != "" && b != "" && a != "dev" && b != "dev"
}
