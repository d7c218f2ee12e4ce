// Package testcap is how a test says that the host lacks a capability it
// needs: root, network namespaces, nftables, cgroups, tmux, Chromium.
//
// A plain t.Skip is invisible in `go test ./...`'s default output, so a
// host that lost a capability would pass by running less. Skip therefore
// fails the test instead of skipping it when the environment says every
// capability must be present: CI=true (the project's CI runs as root on a
// host with all of them, and .ci/run installs tmux and Chromium), or
// RUNNER_TEST_REQUIRE_ALL=1 for a developer who wants the same guarantee.
// Elsewhere it skips, loudly, naming what did not run and why.
//
// Only a missing capability goes through Skip. A test that does not apply
// (a cgroup v1 test on a pure v2 host, -short) skips as usual.
package testcap

import (
	"os"
	"testing"
)

// Required reports whether a missing capability fails a test rather than
// skipping it.
func Required() bool {
	return os.Getenv("CI") == "true" || os.Getenv("RUNNER_TEST_REQUIRE_ALL") == "1"
}

// Skip skips t because the host lacks capability (a short name: "root",
// "netns", "nftables", "cgroups", "tmux", "chromium"), or fails it when
// Required says the host must have it. why says what the test needed the
// capability for, or the error that showed it missing.
func Skip(t testing.TB, capability, why string) {
	t.Helper()
	if Required() {
		t.Fatalf("MISSING CAPABILITY %s: %s (CI=true or RUNNER_TEST_REQUIRE_ALL=1 requires every capability the suite uses; see README)", capability, why)
	}
	t.Skipf("SKIPPED, NOT VERIFIED HERE: needs %s: %s", capability, why)
}

// Root is Skip for "root" unless the test runs as root (euid 0); why
// says what the test needs root for.
func Root(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		Skip(t, "root", why)
	}
}

// Absent skips t because the running kernel was built without feature
// (say, CONFIG_QUOTA), which no package a host can install brings back:
// unlike Skip it skips under CI=true too, since failing there would only
// say that CI's kernel is the kernel it is. Call it only on the kernel's
// own answer (a /proc or /sys file the feature creates is missing, a
// mount refused for the feature); a missing tool or privilege is Skip's.
// .ci/run prints the kernel features the suite looks for, so an absent
// one is in CI's output rather than only under -v.
func Absent(t testing.TB, feature, why string) {
	t.Helper()
	t.Skipf("SKIPPED, NOT VERIFIED ON THIS KERNEL: it lacks %s: %s", feature, why)
}
