package wire

import (
	"encoding/json"
	"fmt"
	"time"
)

// APIVersion is the path prefix of every versioned runnerd endpoint.
const APIVersion = "/v1"

// Header names runnerd sets or reads.
const (
	// HeaderError carries the error code of every non-2xx response runnerd
	// itself produced. A response without it (a proxy's 404, a load
	// balancer's 502) never means anything definitive.
	HeaderError = "Runner-Error"
	// HeaderExit is the trailer (or, when the exit is already known before
	// the body starts, the header) of the plain stream endpoint: the session's
	// exit record as compact JSON.
	HeaderExit = "Runner-Exit"
	// HeaderStreamEnd says how a plain stream body ended: "exit", "lost",
	// "more" or "error". It is a trailer of the running form and a header
	// of the ended form (a session that had ended before the request, whose
	// body has a Content-Length); its presence as a header is what marks
	// the ended form (see docs/protocol.md).
	HeaderStreamEnd = "Runner-Stream-End"
	// HeaderStreamStart is the offset of the first body byte of a stream
	// read (the cursor, or what since resolved to).
	HeaderStreamStart = "Runner-Stream-Start"
	// HeaderStdinOffset, on a POST .../stdin request, is the count of the
	// session's stdin bytes that precede the body (decimal): runnerd
	// skips what the command already got and refuses a gap (409
	// invalid), so a write sent again with the same offset is delivered
	// once. On the 204 answer to such a write it is the count after it.
	// See docs/protocol.md, "Exactly once".
	HeaderStdinOffset = "Runner-Stdin-Offset"
)

// QueryIncarnation is the optional query parameter of every
// /v1/sandboxes/{name}/... route that names the incarnation the caller
// holds: when the live sandbox of that name has another one (or none),
// the answer is 404 not_found, and a DELETE is 204 and touches nothing.
const QueryIncarnation = "incarnation"

// QuerySince is the optional query parameter of the attach and stream
// endpoints that starts each stream at the first byte written at or after
// a time (RFC 3339, any fraction), instead of at a byte cursor: resolved
// from the journal's offset-time marks, so it may start up to SinceGranularity
// earlier, never later. It cannot be combined with a cursor.
const QuerySince = "since"

// SinceGranularity is how much earlier than asked a since read may start:
// the journal's default mark interval.
const SinceGranularity = time.Second

// Sandbox states.
const (
	SandboxRunning   = "running"
	SandboxSuspended = "suspended"
)

// Session states.
const (
	SessionRunning = "running"
	SessionExited  = "exited"
	SessionLost    = "lost"
)

// Exit reasons, as in the exit record.
const (
	ExitExited   = "exited"
	ExitSignaled = "signaled"
	ExitLost     = "lost"
)

// Capability names, the contract's vocabulary. GET /v1/capabilities lists
// only those the host truly delivers.
const (
	CapSuspend          = "suspend"
	CapNetworkPolicy    = "network_policy"
	CapAttach           = "attach"
	CapTTY              = "tty"
	CapPublicURL        = "public_url"
	CapTerminateSession = "terminate_session"
	// CapResourceLimits: sandboxes take Limits (memory, pids, cpu), their
	// usage is reported, and an exit by the kernel's OOM killer reads
	// oom_killed. Advertised only where runnerd can create and write
	// cgroups; elsewhere a create or update with limits is not_supported.
	CapResourceLimits = "resource_limits"
)

// Limits the daemon enforces; a client may check them before sending.
const (
	MaxJSONBody      = 1 << 20  // bytes of any JSON request body
	MaxStdinBody     = 8 << 20  // bytes of one stdin write
	MaxExecOutput    = 16 << 20 // bytes of each stream an exec response carries
	MaxListLimit     = 1000     // largest page of a listing
	DefaultListLimit = 100      // page size when limit is absent
	MaxGraceMS       = 30000    // largest terminate grace
)

// Network is a sandbox's egress policy. An empty (non-nil) Allow denies
// everything.
type Network struct {
	Allow []string `json:"allow"`
}

// CreateSandbox is the body of POST /v1/sandboxes.
type CreateSandbox struct {
	Name    string   `json:"name"`
	User    string   `json:"user,omitempty"`
	Network *Network `json:"network,omitempty"`
	// Limits bound the sandbox's resources (capability resource_limits).
	// Absent: the host's defaults for a new sandbox; an existing sandbox
	// is returned as it is. A zero field is the host's default for it.
	Limits *Limits `json:"limits,omitempty"`
	// From, when set, forks the new sandbox from a checkpoint of another
	// (capability fork, wire/fork.go): its workspace starts as that
	// checkpoint's files, given to the new sandbox; its user, network
	// and limits are this request's. A name that exists is a conflict.
	From *ForkFrom `json:"from,omitempty"`
}

// Limits bound one sandbox's resources, all its sessions together. A zero
// (absent) field means no limit of that kind beyond the host's default.
// Bad values (memory below 1 MiB, negative numbers, a weight outside
// 1..10000, a quota below 1000 us, a period outside 1000..1000000 us or
// without a quota) are 400 invalid.
type Limits struct {
	// MemoryBytes caps memory (anonymous and page cache; no swap beyond
	// it). Past it the kernel's OOM killer kills a process of the sandbox.
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	// Pids caps the tasks (processes and threads) alive at once.
	Pids int64 `json:"pids,omitempty"`
	// CPUWeight is the share of contended CPU, 1..10000 (default 100).
	CPUWeight uint64 `json:"cpu_weight,omitempty"`
	// CPUQuotaUS is the CPU time in microseconds the sandbox may use per
	// CPUPeriodUS (default 100000): quota 2×period is two full cores.
	CPUQuotaUS  int64 `json:"cpu_quota_us,omitempty"`
	CPUPeriodUS int64 `json:"cpu_period_us,omitempty"`
	// DiskBytes and DiskInodes cap the sandbox's disk: its workspace and
	// private /tmp, /var/tmp and /dev/shm, on a volume of runnerd's
	// storage pool (docs/operations.md, "Storage pool"). Enforced only
	// where Info.DiskBudgets is true (else a non-zero value is 501
	// not_supported); DiskInodes only on the ext4 driver (501 on btrfs).
	// Absent at create: runnerd's --default-disk. A budget only grows: in
	// PUT .../limits a smaller value is 400 invalid and an absent one
	// keeps the current. As reported, what the kernel holds (ext4 makes a
	// few more inodes than asked).
	DiskBytes  int64 `json:"disk_bytes,omitempty"`
	DiskInodes int64 `json:"disk_inodes,omitempty"`
}

// Usage is what a sandbox has consumed, read from its cgroup when the
// sandbox is read alone (GET /v1/sandboxes/{name}); listings leave it out.
type Usage struct {
	MemoryBytes     uint64 `json:"memory_bytes"`
	MemoryPeakBytes uint64 `json:"memory_peak_bytes"`
	// CPUUsec is the CPU time of every process that ran in the sandbox
	// since its cgroup was created (at create or the last resume).
	CPUUsec uint64 `json:"cpu_usec"`
	Pids    uint64 `json:"pids"`
	// OOMKills counts the processes the kernel killed for memory.
	OOMKills uint64 `json:"oom_kills"`
	// DiskBytes is what the sandbox's volume holds now, and DiskInodes
	// the inodes in use where the storage driver counts them (ext4);
	// absent for a sandbox without a volume (no disk budget).
	DiskBytes  *int64 `json:"disk_bytes,omitempty"`
	DiskInodes *int64 `json:"disk_inodes,omitempty"`
}

// Sandbox describes one sandbox. Incarnation changes only when a sandbox of
// the same name is destroyed and created again.
type Sandbox struct {
	Name        string     `json:"name"`
	Incarnation string     `json:"incarnation"`
	State       string     `json:"state"`
	CreatedAt   time.Time  `json:"created_at"`
	ParkedAt    *time.Time `json:"parked_at,omitempty"`
	// Workspace is the workspace's path as the sandbox's commands see it
	// (and take it as cwd): "/workspace" in a pod, the host's path
	// otherwise.
	Workspace string `json:"workspace"`
	// HostWorkspace is the workspace's path on runnerd's host, for the
	// operator, where it differs from Workspace (a pod).
	HostWorkspace string `json:"host_workspace,omitempty"`
	// Pod says the sandbox is a pod (--isolate pod): its own user, pid,
	// mount, ipc and uts namespaces, root inside; UID and GID are then
	// the first ids of its block of 65,536 (its root outside).
	Pod     bool     `json:"pod,omitempty"`
	User    string   `json:"user,omitempty"`
	Network *Network `json:"network,omitempty"`
	// Isolated says the sandbox's commands run as an unprivileged user
	// with no way back to privilege (no_new_privs, no capabilities).
	Isolated bool `json:"isolated,omitempty"`
	// UID and GID are the identity runnerd gave the sandbox, which its
	// commands run as and its workspace belongs to; absent when they run
	// as User or as runnerd's own user.
	UID *uint32 `json:"uid,omitempty"`
	GID *uint32 `json:"gid,omitempty"`
	// Limits are the sandbox's limits (absent: none). Usage is present
	// only in the answer for one sandbox, where it has a cgroup.
	Limits *Limits `json:"limits,omitempty"`
	Usage  *Usage  `json:"usage,omitempty"`
}

// WorkspaceOnHost is the workspace's path on runnerd's host: HostWorkspace
// for a pod, Workspace otherwise.
func (s Sandbox) WorkspaceOnHost() string {
	if s.HostWorkspace != "" {
		return s.HostWorkspace
	}
	return s.Workspace
}

// SandboxList is one page of GET /v1/sandboxes. An empty NextPageToken means
// the listing is complete.
type SandboxList struct {
	Sandboxes     []Sandbox `json:"sandboxes"`
	NextPageToken string    `json:"next_page_token"`
}

// URLRequest is the body of POST /v1/sandboxes/{name}/urls.
type URLRequest struct {
	Port int `json:"port"`
}

// URL is the answer of POST /v1/sandboxes/{name}/urls.
type URL struct {
	URL string `json:"url"`
	// Listening says whether something listened on the port when runnerd
	// answered; the URL works once something does. Nil from a runnerd
	// older than this field, which gave a URL only for a port something
	// listened on.
	Listening *bool `json:"listening,omitempty"`
}

// Exit is a session's exit record. Code is meaningful when Reason is
// "exited"; Signal (a number) when Reason is "signaled" (Code is then
// 128+Signal, the shell convention); "lost" means the session's supervisor
// died without recording an exit, and Code is then not an exit status.
// Lengths is the final length in bytes of every stream of the session.
// Terminated says the command ended after a stop was asked for through
// terminate (POST .../terminate, suspend, destroy, an exec's timeout); Code
// and Signal still say how it ended. Absent (false) in records of daemons
// that predate it. OOMKilled says the kernel's OOM killer killed the
// command for its sandbox's memory limit: Reason is then "signaled" with
// Signal 9 (Code 137), as for any SIGKILL.
type Exit struct {
	Reason     string           `json:"reason"`
	Code       int              `json:"code"`
	Signal     int              `json:"signal,omitempty"`
	Detail     string           `json:"detail,omitempty"`
	Lengths    map[string]int64 `json:"lengths,omitempty"`
	Time       time.Time        `json:"time"`
	Terminated bool             `json:"terminated,omitempty"`
	OOMKilled  bool             `json:"oom_killed,omitempty"`
	// UnstoredBytes counts output a terminated session's command wrote
	// after its journal could not take more (disk full, disk budget): given
	// up so that the session could end, and named in Detail. Lengths are
	// what was stored.
	UnstoredBytes int64 `json:"unstored_bytes,omitempty"`
	// Cause names why output went unstored: ExitCauseDiskBudget (the
	// sandbox's journal budget: --sandbox-journal-bytes) or
	// ExitCauseDiskFull (the file system refused it); absent otherwise.
	Cause string `json:"cause,omitempty"`
}

// Exit causes (Exit.Cause).
const (
	ExitCauseDiskBudget = "disk_budget"
	ExitCauseDiskFull   = "disk_full"
)

// CreateSession is the body of POST /v1/sandboxes/{name}/sessions.
type CreateSession struct {
	// ID is optional; when set, a retry with the same ID and the same request
	// returns the existing session instead of starting a second process.
	ID   string   `json:"id,omitempty"`
	Argv []string `json:"argv"`
	Env  []string `json:"env,omitempty"`
	Cwd  string   `json:"cwd,omitempty"`
	TTY  bool     `json:"tty,omitempty"`
	Rows int      `json:"rows,omitempty"`
	Cols int      `json:"cols,omitempty"`
	// MergeStderr gives the command one pipe for stdout and stderr (as
	// `2>&1` does), so the stdout stream holds both in the order the
	// command wrote them and the stderr stream stays empty. Two pipes
	// cannot say which of two writes came first; one pipe can. Not with
	// TTY (a terminal has one stream already).
	MergeStderr bool `json:"merge_stderr,omitempty"`
	// User is who the command runs as inside a pod sandbox: a user name
	// of the pod as made (the host's user database) or "uid[:gid]" below
	// 65536; empty: the sandbox's user (root by default). Refused
	// (invalid) for a sandbox that is not a pod, whose commands run as its
	// identity.
	User string `json:"user,omitempty"`
}

// Session describes one session. Lengths is the length in bytes of each
// stream as the daemon answered (growing while the session runs; the exit
// record's lengths once it ended). WriteError, when not empty, says the
// session's journal cannot be written now (disk full): output and the
// exit record wait for space.
type Session struct {
	ID         string           `json:"id"`
	Sandbox    string           `json:"sandbox"`
	Argv       []string         `json:"argv"`
	TTY        bool             `json:"tty"`
	State      string           `json:"state"`
	PID        int              `json:"pid,omitempty"`
	StartedAt  time.Time        `json:"started_at"`
	Streams    []string         `json:"streams"`
	Lengths    map[string]int64 `json:"lengths,omitempty"`
	WriteError string           `json:"write_error,omitempty"`
	Exit       *Exit            `json:"exit,omitempty"`
	// StatusError, set only in a session list, says the daemon could not
	// read this session's current status: State (and the rest) are as
	// last recorded.
	StatusError string `json:"status_error,omitempty"`
}

// SessionList is one page of GET /v1/sandboxes/{name}/sessions, in start
// order. An empty NextPageToken means the listing is complete.
type SessionList struct {
	Sessions      []Session `json:"sessions"`
	NextPageToken string    `json:"next_page_token"`
}

// Resize is the body of POST .../resize.
type Resize struct {
	Rows int `json:"rows"`
	Cols int `json:"cols"`
}

// Signal is the body of POST .../signal.
type Signal struct {
	Signal SignalName `json:"signal"`
}

// SignalName is a signal as a name ("TERM", "SIGTERM") or a number. It
// decodes from a JSON string or a JSON number and encodes as a string.
type SignalName string

// UnmarshalJSON accepts "TERM", "SIGTERM", "15" or 15.
func (s *SignalName) UnmarshalJSON(b []byte) error {
	var str string
	if err := json.Unmarshal(b, &str); err == nil {
		*s = SignalName(str)
		return nil
	}
	var n json.Number
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("signal: want a name or a number: %w", err)
	}
	*s = SignalName(n.String())
	return nil
}

// Terminate is the body of POST .../terminate. GraceMS 0 (absent, or an
// empty body) means the default grace, 10000 ms; otherwise 1..MaxGraceMS.
type Terminate struct {
	GraceMS int `json:"grace_ms,omitempty"`
}

// Exec is the body of POST /v1/sandboxes/{name}/exec. Stdin is the whole
// standard input (base64 in JSON); the command's stdin is closed after it.
// TimeoutMS bounds the request, not the command's right to run: when it
// elapses the command is terminated (1 s grace) and the answer says TimedOut.
// Zero means no timeout.
type Exec struct {
	ID        string   `json:"id,omitempty"`
	Argv      []string `json:"argv"`
	Env       []string `json:"env,omitempty"`
	Cwd       string   `json:"cwd,omitempty"`
	Stdin     []byte   `json:"stdin,omitempty"`
	TimeoutMS int      `json:"timeout_ms,omitempty"`
	// User is as CreateSession's.
	User string `json:"user,omitempty"`
}

// ExecResult is the answer of an exec. Stdout and Stderr are base64 in JSON
// and hold at most MaxExecOutput bytes each; StdoutTruncated or
// StderrTruncated says more was written (the whole stream stays readable
// through the session's stream endpoints under Session).
type ExecResult struct {
	Session         string `json:"session"`
	Stdout          []byte `json:"stdout"`
	Stderr          []byte `json:"stderr"`
	StdoutTruncated bool   `json:"stdout_truncated"` // always sent, false too
	StderrTruncated bool   `json:"stderr_truncated"`
	TimedOut        bool   `json:"timed_out"`
	Exit            Exit   `json:"exit"`
}

// Capabilities is the answer of GET /v1/capabilities.
type Capabilities struct {
	Capabilities []string `json:"capabilities"`
}

// Capacity is the answer of GET /v1/capacity: what this host holds and
// how much more it will take. A control plane places new sandboxes by it
// (client/fleet); it is a snapshot, stale the moment it is read.
type Capacity struct {
	// Sandboxes is the number of sandboxes this host holds (any state).
	Sandboxes int `json:"sandboxes"`
	// MaxSandboxes is the most it takes (runnerd --max-sandboxes); 0 is
	// no bound.
	MaxSandboxes int `json:"max_sandboxes"`
	// Sessions is the number of sessions the registry calls running or
	// starting.
	Sessions int `json:"sessions"`
	// MaxSessions is the most running sessions it takes (runnerd
	// --max-sessions); 0 is no bound.
	MaxSessions int `json:"max_sessions"`
	// MemoryAvailableBytes is the memory the host can still give without
	// swapping: MemAvailable of /proc/meminfo.
	MemoryAvailableBytes int64 `json:"memory_available_bytes"`
	// PIDsFree is how many more tasks the host can start: the kernel's
	// pid_max less the tasks that exist.
	PIDsFree int64 `json:"pids_free"`
	// Cgroups reports whether runnerd enforces resource limits
	// (capability resource_limits).
	Cgroups bool `json:"cgroups"`
	// MemorySource and PIDsSource say where MemoryAvailableBytes and
	// PIDsFree come from: CapacityCgroup (the sandboxes' cgroup root, or
	// an ancestor, sets a limit: the figure is that limit less what is
	// charged there now, or the host's figure when that is smaller) or
	// CapacityHost (no limit: the host-wide figure).
	MemorySource string `json:"memory_source,omitempty"`
	PIDsSource   string `json:"pids_source,omitempty"`
	// Exhausted is set when a create of a new sandbox would be refused
	// now (Sandboxes >= MaxSandboxes).
	Exhausted bool `json:"exhausted"`
}

// Info is the answer of GET /v1/info: what this runnerd is and holds, for
// an operator (runner info), in one read.
type Info struct {
	// Version is the build (as GET /healthz says it).
	Version string `json:"version"`
	// Capabilities is GET /v1/capabilities' list.
	Capabilities []string `json:"capabilities"`
	// Capacity is GET /v1/capacity's answer: sandboxes, running
	// sessions and the bounds.
	Capacity Capacity `json:"capacity"`
	// StateDir is runnerd's state directory.
	StateDir string `json:"state_dir"`
	// Cgroups is how resource limits are enforced: "v1", "v2", or "off"
	// (not enforced: resource_limits is not advertised).
	Cgroups string `json:"cgroups"`
	// CgroupRoot is the cgroup the sandboxes' cgroups go under (as
	// configured: relative to runnerd's own cgroup unless absolute); ""
	// when Cgroups is off.
	CgroupRoot string `json:"cgroup_root,omitempty"`
	// CgroupFavorDynMods says whether the host's cgroup v2 hierarchy is
	// mounted with favordynmods (its mount line; absent where runnerd
	// found no cgroup2 mount or cgroups are off): on, a session's cgroup
	// move never waits for an RCU grace period (docs/operations.md).
	CgroupFavorDynMods *bool `json:"cgroup_favordynmods,omitempty"`
	// Isolation is which sandboxes run as an unprivileged identity of
	// their own: "pod" (every sandbox is a pod: --isolate pod), "all"
	// (every sandbox: --isolate all, a root runnerd's default), "none"
	// (--isolate none: only those with a network policy), or "off"
	// (runnerd is not root: none).
	Isolation string `json:"isolation"`
	// NetworkTable is the nftables table (family inet) that holds this
	// runnerd's network policy rules, its own among the runnerds of the
	// host; "" when network_policy is not advertised.
	NetworkTable string `json:"network_table,omitempty"`
	// NetworkPending counts the contained sandboxes whose network this
	// runnerd has not yet re-adopted after its start (done in the
	// background; a call that needs one adopts it first). 0 once all are.
	NetworkPending int `json:"network_pending,omitempty"`
	// WarmShims is the warm pool: the shims kept started ahead (Target,
	// 0 when the pool is off) and those waiting now (Idle).
	WarmShims WarmShims `json:"warm_shims"`
	// StorageDriver is the storage driver of the sandboxes' disks:
	// "btrfs", "ext4" or "dir" (empty from a runnerd older than it).
	// DiskBudgets says disk_bytes is enforced (false on "dir"), and
	// DefaultDiskBytes is the budget of a sandbox created without one.
	StorageDriver    string `json:"storage_driver,omitempty"`
	DiskBudgets      bool   `json:"disk_budgets"`
	DefaultDiskBytes int64  `json:"default_disk_bytes,omitempty"`
}

// WarmShims is the warm shim pool's size (Info.WarmShims).
type WarmShims struct {
	Target int `json:"target"`
	Idle   int `json:"idle"`
}

// Health is the answer of GET /healthz.
type Health struct {
	Status  string `json:"status"`
	Version string `json:"version,omitempty"`
}

// ListenFile is the name, in runnerd's state directory, of the file that
// says where the running daemon listens (JSON [Listen]). runnerd writes it
// (mode 0600) once its listeners are open, rewrites it at each start and
// removes it when it stops cleanly; a daemon killed with -9 leaves it
// behind, pointing at addresses nothing may answer.
const ListenFile = "listen.json"

// StartingFile is the name, in runnerd's state directory, of the file
// runnerd writes (mode 0600, JSON [Starting]) as soon as its state
// directory exists, before the slow part of a start (checking the shim,
// recovering sandboxes and sessions), and removes once it serves
// ([ListenFile] then says where) or has failed to start. A client that
// finds it, naming a live process, knows runnerd is starting, not
// stopped: wait, do not tell the user to start it.
const StartingFile = "starting.json"

// Starting is the content of [StartingFile].
type Starting struct {
	PID int `json:"pid"`
}

// Sources of Capacity.MemorySource and Capacity.PIDsSource.
const (
	CapacityCgroup = "cgroup"
	CapacityHost   = "host"
)

// Listen is the content of [ListenFile]: the daemon's actual addresses.
// TCP is host:port ("" without a TCP listener); Socket is the unix
// socket's path ("" without one).
type Listen struct {
	TCP string `json:"tcp,omitempty"`
	// TLS is set when TCP speaks TLS (runnerd --tls-cert): the client
	// dials https://TCP.
	TLS    bool   `json:"tls,omitempty"`
	Socket string `json:"socket,omitempty"`
	PID    int    `json:"pid,omitempty"`
}

// Mark is one offset-time mark of a stream's journal: the write that began
// at byte Offset happened at Time. Every byte from Offset up to the next
// mark's Offset was written at or after Time and before the next mark's
// Time, within GranularityMS of Time.
type Mark struct {
	Offset int64     `json:"offset"`
	Time   time.Time `json:"time"`
}

// Marks is the answer of GET .../sessions/{id}/marks?stream=S&from=N: the
// mark covering byte N (the last at or before it), if the journal holds
// one, then the later marks, at most MaxMarks. Next, when set, is the
// from of the next page (more marks were left off).
type Marks struct {
	Stream        string `json:"stream"`
	Marks         []Mark `json:"marks"`
	Next          *int64 `json:"next,omitempty"`
	GranularityMS int64  `json:"granularity_ms"`
}

// MaxMarks bounds one Marks answer.
const MaxMarks = 1000

// QueryFrom is the marks endpoint's byte offset to list marks from.
const QueryFrom = "from"
