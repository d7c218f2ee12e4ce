package wire

import (
	"bytes"
	"testing"
	"text/template"
)

// TestLimitsString: {{.Limits}} in a template prints named fields, "none"
// for a sandbox without limits (a nil pointer) and for an empty set.
func TestLimitsString(t *testing.T) {
	tmpl := template.Must(template.New("").Parse("{{.Name}} {{.Limits}}"))
	for _, tc := range []struct {
		name string
		l    *Limits
		want string
	}{
		{"nil", nil, "sb none"},
		{"empty", &Limits{}, "sb none"},
		{"some", &Limits{MemoryBytes: 268435456, Pids: 128, CPUQuotaUS: 150000, CPUPeriodUS: 100000}, "sb memory_bytes=268435456 pids=128 cpu_quota_us=150000 cpu_period_us=100000"},
		{"all", &Limits{MemoryBytes: 1, Pids: 2, CPUWeight: 3, CPUQuotaUS: 4, CPUPeriodUS: 5, DiskBytes: 6, DiskInodes: 7},
			"sb memory_bytes=1 pids=2 cpu_weight=3 cpu_quota_us=4 cpu_period_us=5 disk_bytes=6 disk_inodes=7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := tmpl.Execute(&b, Sandbox{Name: "sb", Limits: tc.l}); err != nil {
				t.Fatal(err)
			}
			if b.String() != tc.want {
				t.Errorf("got %q, want %q", b.String(), tc.want)
			}
		})
	}
}
