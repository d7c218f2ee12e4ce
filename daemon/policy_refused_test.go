package daemon_test

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"

	"github.com/agentrunner/runner/internal/testcap"
	"github.com/agentrunner/runner/netpolicy/netlab"
	"github.com/agentrunner/runner/wire"
)

// TestPolicyUpdateKernelRefused: a policy update the kernel refuses
// (its set of allowed addresses is limited by the kernel to fewer
// elements than the new policy has: ENFILE, for real, in the lab's host
// namespace) answers 503 and leaves GET showing exactly what the kernel
// holds. When the old policy fits, runnerd applies it again and records
// it ("the old policy stays in force"); when it does not fit either, the
// sandbox denies all egress and GET says allow: [] ("it now denies all
// egress"). Without restorePolicy GET showed the refused policy as
// enforced.
func TestPolicyUpdateKernelRefused(t *testing.T) {
	lab := netlab.New(t)
	a := startNetDaemonLab(t, lab, passableTempDir(t), testLogger(t))
	// Two ranges the kernel keeps apart (not adjacent), and a third.
	old := []string{netlab.A.String(), netlab.C.String()}
	refused := append(slices.Clone(old), "192.0.2.0/24")
	var info wire.Info
	a.must("GET", "/v1/info", nil, 200, &info)
	for _, tc := range []struct {
		name  string
		limit uint32 // elements the kernel lets the sandbox's set hold
		want  []string
		holds string
	}{
		{"restored", 2, old, "the old policy stays in force"},
		{"deny-all", 1, []string{}, "it now denies all egress"},
	} {
		var sb wire.Sandbox
		a.must("POST", "/v1/sandboxes", wire.CreateSandbox{Name: tc.name, Network: &wire.Network{Allow: old}}, 200, &sb)
		if !slices.Equal(sb.Network.Allow, old) {
			t.Fatalf("%s: created with %v, want %v", tc.name, sb.Network.Allow, old)
		}
		set := limitSet(t, lab, info.NetworkTable, "allow-"+tc.name+"-"+sb.Incarnation, tc.limit)
		if got := kernelRanges(t, lab, set); !slices.Equal(got, ranges(t, old)) {
			t.Fatalf("%s: kernel holds %v before the update, want %v", tc.name, got, ranges(t, old))
		}

		r := a.do("PUT", "/v1/sandboxes/"+tc.name+"/network", wire.Network{Allow: refused})
		a.wantError(r, 503, wire.CodeUnavailable)
		if d := r.errBody(t).Detail; !strings.HasSuffix(d, "; "+tc.holds) || strings.Count(d, "egress") != strings.Count(tc.holds, "egress") {
			t.Errorf("%s: detail %q, want it to end %q and say nothing else of what holds", tc.name, d, "; "+tc.holds)
		}
		a.must("GET", "/v1/sandboxes/"+tc.name, nil, 200, &sb)
		if sb.Network == nil || !slices.Equal(sb.Network.Allow, tc.want) {
			t.Errorf("%s: GET shows %+v after the refused update, want allow %q", tc.name, sb.Network, tc.want)
		}
		if got := kernelRanges(t, lab, set); !slices.Equal(got, ranges(t, tc.want)) {
			t.Errorf("%s: kernel holds %v, want %v (the policy GET must show, %q)", tc.name, got, ranges(t, tc.want), tc.want)
		}
	}
}

// limitSet limits the sandbox set name of table in the lab's host namespace to n
// elements (nft's "size", which the kernel lets an existing set change)
// and returns it; it skips the test on a kernel that keeps the old size.
func limitSet(t *testing.T, lab *netlab.Lab, table, name string, n uint32) *nftables.Set {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(lab.Host)))
	if err != nil {
		t.Fatal(err)
	}
	tbl := &nftables.Table{Name: table, Family: nftables.TableFamilyINet}
	set := &nftables.Set{Table: tbl, Name: name, KeyType: nftables.TypeIPAddr, Interval: true, Size: n}
	if err := c.AddSet(set, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(); err != nil {
		t.Fatalf("limit set %s to %d elements: %v", name, n, err)
	}
	got, err := c.GetSetByName(tbl, name)
	if err != nil {
		t.Fatal(err)
	}
	if got.Size != n {
		testcap.Absent(t, "nft set size update", "this kernel does not change the size of an existing set")
	}
	return got
}

// kernelRanges reads set's elements from the kernel as sorted [lo, hi)
// ranges of IPv4 addresses.
func kernelRanges(t *testing.T, lab *netlab.Lab, set *nftables.Set) [][2]uint64 {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(lab.Host)))
	if err != nil {
		t.Fatal(err)
	}
	elems, err := c.GetSetElements(set)
	if err != nil {
		t.Fatal(err)
	}
	var los, his []uint64
	for _, e := range elems {
		v := uint64(binary.BigEndian.Uint32(e.Key))
		if e.IntervalEnd {
			his = append(his, v)
		} else {
			los = append(los, v)
		}
	}
	slices.Sort(los)
	slices.Sort(his)
	if len(los) != len(his) {
		t.Fatalf("set %s: %d starts and %d ends", set.Name, len(los), len(his))
	}
	out := [][2]uint64{}
	for i := range los {
		out = append(out, [2]uint64{los[i], his[i]})
	}
	return out
}

// ranges is allow (addresses and CIDRs, none adjacent) as kernelRanges
// reads it.
func ranges(t *testing.T, allow []string) [][2]uint64 {
	t.Helper()
	out := [][2]uint64{}
	for _, s := range allow {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				t.Fatalf("%q: %v", s, err)
			}
			p = netip.PrefixFrom(a, 32)
		}
		lo := uint64(binary.BigEndian.Uint32(p.Masked().Addr().AsSlice()))
		out = append(out, [2]uint64{lo, lo + 1<<(32-p.Bits())})
	}
	slices.SortFunc(out, func(x, y [2]uint64) int { return int(x[0]) - int(y[0]) })
	return out
}
