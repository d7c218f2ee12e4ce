package daemon

import "testing"

// TestConfigModes: each mode setting defaults when empty and refuses a
// value it does not take with one message naming every value it takes.
func TestConfigModes(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"netpolicy", Config{NetPolicy: "x"}, `config: netpolicy "x": want "auto" or "off"`},
		{"egress private", Config{EgressPrivate: "x"}, `config: egress private "x": want "allow" or "deny"`},
		{"cgroups", Config{Cgroups: "x"}, `config: cgroups "x": want "auto" or "off"`},
		{"storage", Config{Storage: "x"}, `config: storage "x": want "auto", "btrfs", "ext4" or "dir"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.defaultIsolation()
			if err == nil {
				err = tt.cfg.defaultLimits()
			}
			if err == nil || err.Error() != tt.want {
				t.Fatalf("got %v, want %s", err, tt.want)
			}
		})
	}
	var cfg Config
	if err := cfg.defaultIsolation(); err != nil {
		t.Fatal(err)
	}
	if err := cfg.defaultLimits(); err != nil {
		t.Fatal(err)
	}
	if cfg.NetPolicy != NetPolicyAuto || cfg.EgressPrivate != EgressPrivateDeny || cfg.Cgroups != CgroupsAuto || cfg.Storage != StorageDir {
		t.Fatalf("defaults: got netpolicy %q, egress private %q, cgroups %q, storage %q; want auto, deny, auto, dir",
			cfg.NetPolicy, cfg.EgressPrivate, cfg.Cgroups, cfg.Storage)
	}
}
