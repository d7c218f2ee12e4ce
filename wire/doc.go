// Package wire holds what crosses a process boundary between runner's
// programs and is not the contract itself: the JSON bodies and error codes
// of runnerd's HTTP API (docs/protocol.md), and the binary frame codec that
// both the WebSocket attach and the standalone runner-shim's attach use.
//
// It imports only the standard library, so the client (and a control plane
// that vendors it) never pulls in bbolt, netlink or nftables. Both daemon and
// client import it; neither owns it, and a change here is a protocol change
// that docs/protocol.md must state.
package wire
