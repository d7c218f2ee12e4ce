package adapter

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// Adapter drives one sandbox provider. Every method is safe for concurrent
// use. ctx bounds the call only: it never bounds the life of a sandbox, a
// session or a returned [Stream].
//
// Optional operations (see [Capability]) are methods of this one interface:
// an adapter that does not advertise a capability returns ErrNotSupported
// from every call behind it, and never pretends. Providers do not implement
// it directly: they write a [Driver], and [New] returns the portable
// [Sandboxes], which implements it and makes those refusals.
//
// Every method may also return *UnavailableError or *RateLimitedError
// (transient), *DeniedError, *ProviderError, or a context error when ctx
// ends; the method docs name the other kinds they return.
type Adapter interface {
	// Provider returns the adapter's registry name ("fake", "runner"); it
	// is the Provider of every Handle the adapter returns.
	Provider() string

	// Capabilities returns the optional features the adapter delivers. It
	// is stable for the adapter's lifetime and needs no network.
	Capabilities() Capabilities

	// Create returns the sandbox named name, creating it if it does not
	// exist. It is idempotent: a create of a name that exists adopts the
	// existing sandbox and returns an identical Handle (same ID), also
	// under concurrent creates. It returns *InvalidError for a name the
	// provider cannot accept, and ErrNotSupported when opts asks for a
	// capability (network policy) the adapter does not advertise.
	Create(ctx context.Context, name string, opts CreateOptions) (Handle, error)

	// Get returns the live sandbox named name. It returns ErrNotFound only
	// when the provider definitively says no such sandbox exists; every
	// failure that proves nothing is *UnavailableError.
	Get(ctx context.Context, name string) (Handle, error)

	// List returns one page of the account's sandboxes. Pass the previous
	// page's NextPageToken to continue; an empty NextPageToken ends the
	// listing. Every page has at most opts.PageSize handles (when set). A
	// listing the adapter cannot complete (a page cut mid-response) is an
	// error (*UnavailableError), never a short page that looks whole. It
	// returns *InvalidError for a page token it did not issue. See
	// [ListAll].
	List(ctx context.Context, opts ListOptions) (Page, error)

	// Destroy stops the sandbox's processes and removes it and its disk.
	// Absent is success: destroying a sandbox that does not exist (or an
	// incarnation that was already replaced) returns nil and touches
	// nothing else.
	Destroy(ctx context.Context, h Handle) error

	// Exec runs c to completion and returns its output and true exit. A
	// non-zero exit is a Result, not an error. When ctx ends first the
	// adapter stops the command where it can and returns an error wrapping
	// ctx.Err(). It returns ErrNotFound when the sandbox is gone and
	// *InvalidError when it is suspended or c is malformed. A command the
	// sandbox cannot find is an exit (conventionally 127), not an error.
	Exec(ctx context.Context, h Handle, c Command) (Result, error)

	// Spawn starts c as a detachable session and returns only once the
	// process runs (stdin written right after Spawn returns is not lost).
	// The returned Stream replays the session from byte zero. When
	// opts.SessionID is set and a session with that id exists for the same
	// command, Spawn attaches to it instead of starting a second process;
	// the same id with a different command is *InvalidError. It returns
	// ErrNotSupported when opts.TTY is set and CapTTY is not advertised.
	Spawn(ctx context.Context, h Handle, c Command, opts SpawnOptions) (Stream, error)

	// Attach rejoins session id, replaying each stream from the cursor (the
	// zero Cursor is byte zero) and then following it live until the
	// terminal frame. It returns ErrNotFound for an unknown session,
	// ErrTruncated for a cursor behind retained output, *InvalidError for a
	// cursor beyond a stream's end, and ErrNotSupported without CapAttach.
	Attach(ctx context.Context, h Handle, id string, from Cursor) (Stream, error)

	// Sessions lists the sandbox's sessions, running and ended, in start
	// order. It returns ErrNotFound when the sandbox is gone.
	Sessions(ctx context.Context, h Handle) ([]SessionInfo, error)

	// WriteStdin writes p to the session's stdin. It returns
	// ErrCommandExited once the command has exited (never a transport
	// error for that race), ErrNotFound for an unknown session, and
	// *WriteFailedError when the bytes could not be delivered to a running
	// command. A write never closes stdin.
	WriteStdin(ctx context.Context, h Handle, id string, p []byte) error

	// CloseStdin sends a real EOF to the session's stdin, once; closing an
	// already closed stdin of a running command returns nil. It returns
	// ErrCommandExited once the command has exited and ErrNotFound for an
	// unknown session.
	CloseStdin(ctx context.Context, h Handle, id string) error

	// Resize sets a TTY session's window size. It returns ErrNotSupported
	// without CapTTY, *InvalidError for a pipes session or a zero size,
	// and ErrCommandExited after the exit.
	Resize(ctx context.Context, h Handle, id string, size TTYSize) error

	// TerminateSession stops session id: SIGTERM to the process group,
	// then SIGKILL once grace has passed, and returns only when the final
	// frame is recorded, with the exit it carries. grace must be within
	// [MinGrace, MaxGrace], else *InvalidError. Terminating an ended
	// session returns its recorded exit. An outcome the adapter cannot
	// confirm is *UnavailableError (uncertain: the host must not reuse the
	// session). It returns ErrNotSupported without CapTerminateSession; an
	// adapter never destroys the sandbox as a fallback.
	TerminateSession(ctx context.Context, h Handle, id string, grace time.Duration) (Exit, error)

	// Suspend parks the sandbox: its processes stop (their streams end with
	// ReasonTerminated) and its disk is kept at storage cost with no TTL
	// that destroys it. Suspending a suspended sandbox returns nil. It
	// returns ErrNotSupported without CapSuspend.
	Suspend(ctx context.Context, h Handle) error

	// Resume brings a parked sandbox back with the same disk. Resuming a
	// running sandbox returns nil. It returns *RestoreFailedError when the
	// disk cannot be given back (never a fresh disk in its place), and
	// ErrNotSupported without CapSuspend.
	Resume(ctx context.Context, h Handle) error

	// Checkpoint snapshots the sandbox's disk and returns the checkpoint's
	// id. It returns ErrNotSupported without CapCheckpoint.
	Checkpoint(ctx context.Context, h Handle) (string, error)

	// Restore replaces the sandbox's disk with checkpoint id. It returns
	// *RestoreFailedError when it cannot, *InvalidError for an unknown
	// checkpoint (never ErrNotFound, which speaks only of the sandbox), and
	// ErrNotSupported without CapCheckpoint.
	Restore(ctx context.Context, h Handle, id string) error

	// SetNetworkPolicy replaces the sandbox's egress policy. An empty
	// Allow denies everything (DNS and raw IPs included); it is never a
	// no-op. A policy the adapter cannot enforce is refused (fail closed),
	// never accepted. It returns ErrNotSupported without CapNetworkPolicy.
	SetNetworkPolicy(ctx context.Context, h Handle, p NetworkPolicy) error

	// PublicURL returns a URL for port that a browser opens with no
	// provider credential. It returns *InvalidError for a port outside
	// 1-65535 and ErrNotSupported without CapPublicURL; it never returns a
	// guessed URL. A provider may also refuse, with *InvalidError, a port
	// nothing listens on in the sandbox (runnerd does not: its URL works
	// once something listens).
	PublicURL(ctx context.Context, h Handle, port int) (string, error)
}

// Capability is an optional feature. A capability is a promise about the
// answer: advertised means the calls behind it work as documented; not
// advertised means they return ErrNotSupported.
type Capability string

// The capabilities and the calls behind them.
const (
	// CapSuspend: Suspend and Resume park and restore with the same disk.
	CapSuspend Capability = "suspend"
	// CapNetworkPolicy: SetNetworkPolicy and CreateOptions.NetworkPolicy
	// are enforced.
	CapNetworkPolicy Capability = "network_policy"
	// CapCheckpoint: Checkpoint and Restore.
	CapCheckpoint Capability = "checkpoint"
	// CapAttach: Attach rejoins a session with replay from a cursor.
	CapAttach Capability = "attach"
	// CapTTY: SpawnOptions.TTY and Resize.
	CapTTY Capability = "tty"
	// CapPublicURL: PublicURL.
	CapPublicURL Capability = "public_url"
	// CapTerminateSession: TerminateSession.
	CapTerminateSession Capability = "terminate_session"
	// CapFork: Sandboxes.Fork makes a sandbox from another's checkpoint
	// ([Forker]).
	CapFork Capability = "fork"
)

// AllCapabilities lists every capability, in a fixed order.
func AllCapabilities() []Capability {
	return []Capability{CapSuspend, CapNetworkPolicy, CapCheckpoint, CapAttach, CapTTY, CapPublicURL, CapTerminateSession, CapFork}
}

// Capabilities is the set an adapter advertises.
type Capabilities []Capability

// Has reports whether c is in the set.
func (cs Capabilities) Has(c Capability) bool { return slices.Contains(cs, c) }

// Grace bounds for [Adapter.TerminateSession].
const (
	MinGrace = time.Millisecond
	MaxGrace = 30 * time.Second
)

// CheckGrace returns *InvalidError when grace is outside [MinGrace,
// MaxGrace].
func CheckGrace(grace time.Duration) error {
	if grace < MinGrace || grace > MaxGrace {
		return &InvalidError{Detail: fmt.Sprintf("grace %v outside %v..%v", grace, MinGrace, MaxGrace)}
	}
	return nil
}

// CreateOptions tune [Adapter.Create]. They apply only when the sandbox is
// created; an adopting create ignores them.
type CreateOptions struct {
	// NetworkPolicy, when not nil, is in force before any command runs.
	// It needs CapNetworkPolicy.
	NetworkPolicy *NetworkPolicy
}

// NetworkPolicy is a sandbox's egress allowlist.
type NetworkPolicy struct {
	// Allow lists the hosts (names or IPs) the sandbox may reach. Empty
	// (nil or zero length) denies all egress, DNS included.
	Allow []string
}

// ListOptions select a page of [Adapter.List].
type ListOptions struct {
	// PageToken continues a listing; "" starts one.
	PageToken string
	// PageSize caps the page; 0 lets the adapter choose.
	PageSize int
}

// Page is one page of a listing.
type Page struct {
	Handles []Handle
	// NextPageToken continues the listing; "" means it is complete.
	NextPageToken string
}

// ListAll drives a listing to its end and returns every handle, or an error
// and no handles: a listing interrupted at any page is never returned as a
// short set. It stops with *ProviderError after maxPages pages (a listing
// that does not terminate is a provider bug); maxPages <= 0 means 10,000.
func ListAll(ctx context.Context, a Adapter, pageSize, maxPages int) ([]Handle, error) {
	if maxPages <= 0 {
		maxPages = 10000
	}
	var all []Handle
	token := ""
	for range maxPages {
		p, err := a.List(ctx, ListOptions{PageToken: token, PageSize: pageSize})
		if err != nil {
			return nil, fmt.Errorf("list page: %w", err)
		}
		all = append(all, p.Handles...)
		if p.NextPageToken == "" {
			return all, nil
		}
		token = p.NextPageToken
	}
	return nil, &ProviderError{Provider: a.Provider(), Detail: fmt.Sprintf("listing did not end after %d pages", maxPages)}
}

// Command is a program to run in a sandbox.
type Command struct {
	// Path is the program, looked up in the sandbox's PATH ("sh", "bash").
	Path string
	// Args are the arguments, without the program name.
	Args []string
	// Env adds KEY=VALUE entries to the sandbox's environment.
	Env []string
	// Dir is the working directory; "" is the sandbox's workspace.
	Dir string
}

// Shell returns the command sh -c script, the shape of the seed fixtures.
func Shell(script string) Command { return Command{Path: "sh", Args: []string{"-c", script}} }

func (c Command) String() string {
	return fmt.Sprintf("%q", append([]string{c.Path}, c.Args...))
}

// Result is the outcome of [Adapter.Exec].
type Result struct {
	Stdout []byte
	Stderr []byte
	Exit   Exit
}

// TTYSize is a terminal window size.
type TTYSize struct {
	Rows uint16
	Cols uint16
}

// SpawnOptions tune [Adapter.Spawn].
type SpawnOptions struct {
	// SessionID, when set, names the session so that a retried Spawn
	// attaches to the process the first try started instead of starting a
	// second. "" lets the adapter mint one.
	SessionID string
	// TTY, when not nil, runs the command on a terminal of that size: one
	// stream (Stdout) carries everything. It needs CapTTY.
	TTY *TTYSize
	// Buffer is the frame channel's capacity; 0 lets the adapter choose.
	Buffer int
}

// SessionState is where a session is in its life.
type SessionState string

const (
	// SessionRunning: the command runs.
	SessionRunning SessionState = "running"
	// SessionExited: the command ended and its exit is recorded.
	SessionExited SessionState = "exited"
	// SessionLost: the command ended without an exit record (ErrLost).
	SessionLost SessionState = "lost"
)

// SessionInfo describes one session of a sandbox.
type SessionInfo struct {
	ID      string
	Command Command
	TTY     bool
	State   SessionState
	// Exit is set when State is SessionExited.
	Exit *Exit
	// Stdout and Stderr are the bytes recorded so far per stream.
	Stdout, Stderr int64
	Started        time.Time
}
