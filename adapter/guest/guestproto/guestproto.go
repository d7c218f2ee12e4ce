// Package guestproto is the in-guest protocol between runner-shim and
// the adapter that drives it through a provider's exec (adapter/guest,
// and adapter/sprites' paged list): the one --json answer line every
// runner-shim subcommand prints, written by cmd/runner-shim and read by
// the adapters, defined once so that neither side keeps a private mirror
// of the other.
//
// Requests are runner-shim's argv (its subcommands and flags, see
// cmd/runner-shim's usage); answers are one JSON object on the last line
// of stdout, beside the exit status.
//
// Invariants: the bytes on the wire are those runner-shim printed when it
// built its answers as map[string]any: Answer's fields are declared in
// the order of their JSON names (encoding/json sorted the map's keys),
// and a field is left out exactly when the map had no such key
// (answer_test.go and cmd/runner-shim's golden test hold this). The
// package imports only the standard library and wire (deps_test.go).
package guestproto

import (
	"time"

	"github.com/agentrunner/runner/wire"
)

// Answer is one --json answer of runner-shim. S is the session object:
// runner-shim's own session info when it writes, [Info] when an adapter
// reads (or json.RawMessage to pass sessions on untouched).
type Answer[S any] struct {
	// Created is spawn's: true when this call started the session, false
	// when an earlier spawn of the same request had.
	Created *bool `json:"created,omitempty"`
	// Error is set on every failure, and only then.
	Error *Error `json:"error,omitempty"`
	// Exit is terminate's: the session's exit record.
	Exit *wire.Exit `json:"exit,omitempty"`
	// ID names the session (spawn, write, close-stdin, signal, resize,
	// terminate).
	ID string `json:"id,omitempty"`
	// More is list's: another page follows (list --after the last id).
	More bool `json:"more,omitempty"`
	// OK is the acknowledgement of write, close-stdin, signal and resize.
	OK bool `json:"ok,omitempty"`
	// Session is spawn's and status's.
	Session *S `json:"session,omitempty"`
	// Sessions is list's page (an empty page is [], never left out).
	Sessions []S `json:"sessions,omitzero"`
	// Version is runner-shim's version, on every answer.
	Version string `json:"version"`
	// Written is write's byte count when the data came in argv.
	Written *int `json:"written,omitempty"`
}

// Error is a --json error: the contract's wire error and, for a command
// whose program could not be started, ExecError.
type Error struct {
	wire.Error
	// ExecError refines an invalid spawn the way runnerd's answers do:
	// ExecNotFound or ExecNotExecutable; empty for every other error.
	ExecError string `json:"exec_error,omitempty"`
}

// The values of Error.ExecError.
const (
	ExecNotFound      = "not_found"
	ExecNotExecutable = "not_executable"
)

// Info is runner-shim's session object (status, and each entry of list).
type Info struct {
	ID string `json:"id"`
	// State is "running", "exited" or "lost".
	State string `json:"state"`
	// ShimPID and PID are the supervisor's and the command's process ids
	// (left out when unknown).
	ShimPID int  `json:"shim_pid,omitempty"`
	PID     int  `json:"pid,omitempty"`
	TTY     bool `json:"tty"`
	// Exit is the exit record once State is "exited".
	Exit *wire.Exit `json:"exit,omitempty"`
	// WriteError is set while the supervisor cannot write the journal.
	WriteError string    `json:"write_error,omitempty"`
	StartedAt  time.Time `json:"started_at"`
	// Descendants counts the live processes the session started besides
	// the command (0 when read from disk, -1 when unknown).
	Descendants int      `json:"descendants,omitempty"`
	Argv        []string `json:"argv"`
	Cwd         string   `json:"cwd,omitempty"`
	// Stdout and Stderr are the bytes each stream holds now.
	Stdout int64 `json:"stdout"`
	Stderr int64 `json:"stderr"`
}
