// Package stream is the client side of runnerd's and runner-shim's wire
// protocol that every provider adapter shares: it converts wire error
// codes (wire.ErrorTable) into the adapter taxonomy, exit records into
// adapter.Exit, signal numbers into names, and a sequence of wire frames
// into an adapter.Stream that reattaches from its cursors after a
// transport failure.
//
// API: Kind, Code, KindError and FrameError map wire error codes;
// Exit and Frame map exit records and frames; New makes an adapter.Stream
// from a Conn and a Dialer; NewDecoderConn is the Conn for a raw frame
// byte stream (runner-shim attach's stdout).
//
// The client package drives runnerd with it; hosted adapters that run
// runner-shim inside a provider's sandbox (over the provider's exec or
// file API) reuse it unchanged, so a lost session, a truncated cursor or a
// signal death reads the same whichever provider carried the bytes.
//
// Invariants: stream imports only the standard library, adapter and wire
// (deps_test.go holds it to that). An error frame never becomes an exit,
// a lost session never becomes exit 0, and a not_found inside a stream is
// never definitive (it is not a registry answer).
package stream
