package netpolicy

// The rule expressions the chains are built from, each the nftables
// bytecode of one nft match or verdict, and the interval-set elements of
// a prefix list.

import (
	"encoding/binary"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// intervalElements turns IPv4 prefixes into interval-set elements,
// merging overlapping and adjacent ranges (the kernel rejects overlaps):
// the ranges a policy's covers searches (mergeRanges), as the kernel
// holds them.
func intervalElements(prefixes []netip.Prefix) []nftables.SetElement {
	var out []nftables.SetElement
	for _, r := range mergeRanges(prefixes) {
		out = append(out, nftables.SetElement{Key: binary.BigEndian.AppendUint32(nil, uint32(r.lo))})
		if r.hi < 1<<32 {
			out = append(out, nftables.SetElement{Key: binary.BigEndian.AppendUint32(nil, uint32(r.hi)), IntervalEnd: true})
		}
	}
	return out
}

func concat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func matchIPv4() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
	}
}

// matchAddr compares the IPv4 header field at off (12 saddr, 16 daddr).
func matchAddr(off uint32, a netip.Addr, op expr.CmpOp) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4},
		&expr.Cmp{Op: op, Register: 1, Data: a.AsSlice()},
	}
}

// matchPrefix matches the IPv4 header field at off against prefix p.
func matchPrefix(off uint32, p netip.Prefix) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: net4Mask(p.Bits()), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: p.Masked().Addr().AsSlice()},
	}
}

// matchIfPrefix matches an interface name (iifname or oifname) that
// starts with prefix, like nft's `iifname "rn*"`.
func matchIfPrefix(key expr.MetaKey, prefix string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte(prefix)},
	}
}

// dispatchVMap is `iifname vmap @m` (or oifname): one hash lookup whose
// result is the verdict, a jump to the sandbox's chain.
func dispatchVMap(key expr.MetaKey, m *nftables.Set) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Lookup{SourceRegister: 1, DestRegister: 0, IsDestRegSet: true, SetName: m.Name, SetID: m.ID},
	}
}

// matchOwnGateway matches a packet whose pair (input interface,
// destination address) is in gws: `iifname . ip daddr @sandbox-gw`. The
// key is built in the 32-bit registers: the name in 8-11, the address in
// 12.
func matchOwnGateway(gws *nftables.Set) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 8},
		&expr.Payload{DestRegister: 12, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Lookup{SourceRegister: 8, SetName: gws.Name, SetID: gws.ID},
	}
}

func matchSet(off uint32, s *nftables.Set) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4},
		&expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID},
	}
}

func matchL4Port(proto byte, port uint16) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
	}
}

func matchCtEstablished() []expr.Any {
	return matchCtState(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED)
}

// matchCtState matches a packet whose conntrack state is one of bits.
func matchCtState(bits uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(bits),
			Xor:  binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

func verdict(k expr.VerdictKind) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: k}}
}

// rejectTCP answers a TCP packet with a reset, so a denied connect fails
// at once ("connection refused") instead of hanging.
func rejectTCP() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Reject{Type: unix.NFT_REJECT_TCP_RST},
	}
}

// rejectAny answers with ICMP(v6) administratively prohibited.
func rejectAny() []expr.Any {
	return []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}}
}

func ifname(n string) []byte {
	b := make([]byte, 16)
	copy(b, n)
	return b
}

func net4Mask(bits int) []byte {
	return binary.BigEndian.AppendUint32(nil, ^uint32(0)<<(32-bits))
}
