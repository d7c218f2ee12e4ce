package wire

import (
	"strconv"
	"strings"
)

// String names each limit that is set by its JSON key, as "memory_bytes=268435456
// pids=128", and is "none" for nil or no limit at all. It is what a Go
// template prints for {{.Limits}} (runner ls --format): without it the
// struct printed as a row of bare numbers whose order said which was which.
func (l *Limits) String() string {
	if l == nil {
		return "none"
	}
	var b strings.Builder
	for _, f := range []struct {
		key string
		v   int64
	}{
		{"memory_bytes", l.MemoryBytes},
		{"pids", l.Pids},
		{"cpu_weight", int64(l.CPUWeight)},
		{"cpu_quota_us", l.CPUQuotaUS},
		{"cpu_period_us", l.CPUPeriodUS},
		{"disk_bytes", l.DiskBytes},
		{"disk_inodes", l.DiskInodes},
	} {
		if f.v == 0 {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(f.key + "=" + strconv.FormatInt(f.v, 10))
	}
	if b.Len() == 0 {
		return "none"
	}
	return b.String()
}
