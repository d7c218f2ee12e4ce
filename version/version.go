// Package version names the build of runner's three binaries (runnerd,
// runner, runner-shim), so that /healthz, the daemon's start log, `runner
// version` and runner-shim's answers all say the same thing, and a client or
// a daemon can tell when the two ends were built apart.
//
// The version comes, in order, from the linker (install.sh passes
// -ldflags "-X github.com/agentrunner/runner/version.Version=..." from `git
// describe`, because Go's own VCS stamping fails in a checkout owned by
// another user, the usual `sudo` case), from the main module's version when
// the binaries were built with `go install module@version`, or from the VCS
// revision Go stamped into the build; a build with none of these is "dev".
package version

import (
	"runtime/debug"
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
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
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
	if rev == "" {
		return "dev"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if modified {
		rev += "-dirty"
	}
	return "dev-" + rev
}

// Skewed reports whether two versions name different builds in a way worth
// a warning: both are known (neither is "dev") and they differ.
func Skewed(a, b string) bool {
	return a != b && a != "" && b != "" && a != "dev" && b != "dev"
}
