package client

import "github.com/agentrunner/runner/wire"

// SignalName returns the name of Linux signal n ("SIGKILL" for 9), "SIGRTMIN+k"
// for real-time signals, or "SIG<n>" for anything else. It is never empty,
// so a signal death can never read as an exit. It is wire.SignalString.
func SignalName(n int) string { return wire.SignalString(n) }
