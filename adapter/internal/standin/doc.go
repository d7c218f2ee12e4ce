// Package standin holds the plumbing the provider stand-ins
// (adapter/e2b/e2btest, adapter/daytona/daytonatest,
// adapter/sprites/spritestest) share, so each holds only its provider's
// behaviour: the HTTP fault switchboard ([Faults]: outage, dropped
// connections, 429s, cut list bodies, request counts, [Faults.Serve]);
// an API's routes behind its credential check ([API], [Bearer],
// [HeaderIs]); the JSON writers and list helpers ([WriteJSON],
// [Faults.WriteList], [QueryLimit], [SeqCursor]); opening a pseudo-terminal with the standard library alone; and
// killing every process of one sandbox, found by an environment variable
// the stand-in sets on what it starts.
//
// Invariants: the package imports only the standard library (the stand-ins
// may not pull a PTY library into a control plane's test build), and
// [KillTagged] signals only processes whose environment carries the exact
// NAME=id entry, by pid, never itself. A fault switched on applies to the
// next request a server reads; a request a fault answered never reaches
// the provider's handler.
package standin
