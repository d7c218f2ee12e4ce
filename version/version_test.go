package version

import (
	"runtime/debug"
	"testing"
)

func TestResolve(t *testing.T) {
	info := func(main string, settings ...debug.BuildSetting) func() (*debug.BuildInfo, bool) {
		return func() (*debug.BuildInfo, bool) {
			return &debug.BuildInfo{Main: debug.Module{Version: main}, Settings: settings}, true
		}
	}
	none := func() (*debug.BuildInfo, bool) { return nil, false }
	rev := debug.BuildSetting{Key: "vcs.revision", Value: "9341c11a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e"}
	dirty := debug.BuildSetting{Key: "vcs.modified", Value: "true"}
	clean := debug.BuildSetting{Key: "vcs.modified", Value: "false"}
	for _, tc := range []struct {
		name   string
		linked string
		info   func() (*debug.BuildInfo, bool)
		want   string
	}{
		{"linker wins", "v1.4.0-3-gabc", info("v9.9.9", rev), "v1.4.0-3-gabc"},
		{"module version", "", info("v1.2.3", rev), "v1.2.3"},
		{"vcs revision", "", info("(devel)", rev, clean), "dev-9341c11a0b1c"},
		// Go 1.24+ stamps a checkout's build with a pseudo-version; the
		// version is the revision form install.sh stamps too.
		{"pseudo-version", "", info("v0.0.0-20261202023455-9341c11a0b1c", rev, clean), "dev-9341c11a0b1c"},
		{"pseudo-version dirty", "", info("v0.0.0-20261202023455-9341c11a0b1c+dirty", rev, dirty), "dev-9341c11a0b1c-dirty"},
		{"clean tag", "", info("v1.2.3", rev, clean), "v1.2.3"},
		{"dirty tag", "", info("v1.2.3+dirty", rev, dirty), "dev-9341c11a0b1c-dirty"},
		{"dirty tree", "", info("(devel)", rev, dirty), "dev-9341c11a0b1c-dirty"},
		{"nothing stamped", "", info("(devel)"), "dev"},
		{"no build info", "", none, "dev"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := resolve(tc.linked, tc.info); got != tc.want {
				t.Errorf("resolve: got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestSkewed(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"v1", "v1", false},
		{"v1", "v2", true},
		{"dev", "v2", false},
		{"v1", "", false},
	} {
		if got := Skewed(tc.a, tc.b); got != tc.want {
			t.Errorf("Skewed(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}
