package fake

import (
	"context"
	"encoding/hex"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/agentrunner/runner/adapter"
)

// Adapter is the in-memory adapter: the portable adapter.Sandboxes over
// the fake's driver, plus the fault hooks. Create one with [New]; it is
// safe for concurrent use, and whoever creates it must Close it.
type Adapter struct {
	*adapter.Sandboxes
	d *driver
}

// driver is the in-memory model behind Adapter: adapter.Driver with every
// optional interface, its capabilities declared by [WithCapabilities].
// The portable type checks names, handles, options and capabilities
// before any call reaches it.
type driver struct {
	provider string
	caps     adapter.Capabilities
	pageSize int
	buffer   int

	ctx    context.Context // ends reader goroutines; canceled by Close
	cancel context.CancelFunc
	procs  sync.WaitGroup // process goroutines
	reads  sync.WaitGroup // reader goroutines

	mu            sync.Mutex // guards every field below and all sandbox and session state
	sandboxes     map[string]*sandbox
	seq           uint64
	outage        int // > 0: every call is unavailable
	interruptList bool
	closed        bool
}

type sandbox struct {
	name, id    string
	suspended   bool
	files       map[string][]byte
	policy      *adapter.NetworkPolicy // nil: egress open
	sessions    map[string]*session
	order       []string // session ids in start order
	checkpoints map[string]map[string][]byte
	urls        map[int]string
}

var (
	_ adapter.Adapter    = (*Adapter)(nil)
	_ adapter.FullDriver = (*driver)(nil)
)

// Option configures [New].
type Option func(*driver)

// WithProvider sets the provider name (default "fake").
func WithProvider(name string) Option { return func(a *driver) { a.provider = name } }

// WithCapabilities sets the advertised capabilities (default: all). The
// calls behind a capability left out return adapter.ErrNotSupported.
func WithCapabilities(caps ...adapter.Capability) Option {
	return func(a *driver) { a.caps = slices.Clone(caps) }
}

// WithPageSize sets the page size List uses when the caller sets none
// (default 100).
func WithPageSize(n int) Option { return func(a *driver) { a.pageSize = n } }

// WithBuffer sets the default frame channel capacity (default 64).
func WithBuffer(n int) Option { return func(a *driver) { a.buffer = n } }

// New returns an empty Adapter.
func New(opts ...Option) *Adapter {
	a := &driver{
		provider:  "fake",
		caps:      adapter.AllCapabilities(),
		pageSize:  100,
		buffer:    64,
		sandboxes: make(map[string]*sandbox),
	}
	for _, o := range opts {
		o(a)
	}
	a.ctx, a.cancel = context.WithCancel(context.Background())
	return &Adapter{Sandboxes: adapter.New(a, adapter.Options{}), d: a}
}

// Close kills every command (their streams end with adapter.ErrLost),
// stops every reader and waits for all goroutines. A consumer that is not
// reading may see its channel closed without a terminal frame. Calls after
// Close return *adapter.UnavailableError. Close is idempotent.
func (a *Adapter) Close() error { return a.d.Close() }

// Outage starts an induced control-plane outage: until restore is called,
// every call returns *adapter.UnavailableError (running commands go on).
// Outages nest; restore is idempotent.
func (a *Adapter) Outage() (restore func()) { return a.d.Outage() }

// InterruptNextList makes the next List call fail as a listing cut
// mid-response does: *adapter.UnavailableError, and no page.
func (a *Adapter) InterruptNextList() { a.d.InterruptNextList() }

// CorruptCheckpoint damages checkpoint id, so that restoring it fails
// with *adapter.RestoreFailedError and leaves the files as they are: the
// conformance suite's Subject.CorruptCheckpoint hook.
func (a *Adapter) CorruptCheckpoint(h adapter.Handle, id string) error {
	return a.d.CorruptCheckpoint(h, id)
}

// Close is Adapter.Close.
func (a *driver) Close() error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil
	}
	a.closed = true
	for _, sb := range a.sandboxes {
		for _, s := range sb.sessions {
			s.stop(true)
		}
	}
	a.mu.Unlock()
	a.procs.Wait()
	a.cancel()
	a.reads.Wait()
	return nil
}

// Outage is Adapter.Outage.
func (a *driver) Outage() (restore func()) {
	a.mu.Lock()
	a.outage++
	a.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			a.mu.Lock()
			a.outage--
			a.mu.Unlock()
		})
	}
}

// InterruptNextList is Adapter.InterruptNextList.
func (a *driver) InterruptNextList() {
	a.mu.Lock()
	a.interruptList = true
	a.mu.Unlock()
}

// Provider returns the provider name.
func (a *driver) Provider() string { return a.provider }

// Capabilities returns the advertised set.
func (a *driver) Capabilities() adapter.Capabilities { return slices.Clone(a.caps) }

// lock takes a.mu and checks the call may proceed; on error a.mu is not held.
func (a *driver) lock(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	a.mu.Lock()
	switch {
	case a.closed:
		a.mu.Unlock()
		return &adapter.UnavailableError{Detail: "fake: adapter closed"}
	case a.outage > 0:
		a.mu.Unlock()
		return &adapter.UnavailableError{Detail: "fake: induced control-plane outage"}
	}
	return nil
}

// lockSandbox is lock plus the lookup of h's incarnation.
func (a *driver) lockSandbox(ctx context.Context, h adapter.Handle) (*sandbox, error) {
	if err := a.lock(ctx); err != nil {
		return nil, err
	}
	sb, ok := a.sandboxes[h.Name]
	if !ok || sb.id != h.ID {
		a.mu.Unlock()
		return nil, fmt.Errorf("sandbox %s: %w", h.Name, adapter.ErrNotFound)
	}
	return sb, nil
}

// lockSession is lockSandbox plus the lookup of session id in it.
func (a *driver) lockSession(ctx context.Context, h adapter.Handle, id string) (*session, error) {
	sb, err := a.lockSandbox(ctx, h)
	if err != nil {
		return nil, err
	}
	s, err := sb.session(id)
	if err != nil {
		a.mu.Unlock()
		return nil, err
	}
	return s, nil
}

func (a *driver) handle(sb *sandbox) adapter.Handle {
	return adapter.Handle{Provider: a.provider, Name: sb.name, ID: sb.id, Private: adapter.NewPrivate(privateData{Token: "fake-token-" + sb.id})}
}

func (a *driver) next(prefix string) string {
	a.seq++
	return prefix + strconv.FormatUint(a.seq, 10)
}

// Create returns the sandbox named name, creating it when absent.
func (a *driver) Create(ctx context.Context, name string, opts adapter.CreateOptions) (adapter.Handle, error) {
	if err := a.lock(ctx); err != nil {
		return adapter.Handle{}, err
	}
	defer a.mu.Unlock()
	if sb, ok := a.sandboxes[name]; ok {
		return a.handle(sb), nil
	}
	sb := &sandbox{
		name:        name,
		id:          a.next("inc-"),
		files:       make(map[string][]byte),
		sessions:    make(map[string]*session),
		checkpoints: make(map[string]map[string][]byte),
		urls:        make(map[int]string),
	}
	if opts.NetworkPolicy != nil {
		sb.policy = &adapter.NetworkPolicy{Allow: slices.Clone(opts.NetworkPolicy.Allow)}
	}
	a.sandboxes[name] = sb
	return a.handle(sb), nil
}

// Get returns the sandbox named name, or adapter.ErrNotFound.
func (a *driver) Get(ctx context.Context, name string) (adapter.Handle, error) {
	if err := a.lock(ctx); err != nil {
		return adapter.Handle{}, err
	}
	defer a.mu.Unlock()
	sb, ok := a.sandboxes[name]
	if !ok {
		return adapter.Handle{}, fmt.Errorf("sandbox %s: %w", name, adapter.ErrNotFound)
	}
	return a.handle(sb), nil
}

// List pages through the sandboxes in name order. The page token is the
// last name of the previous page.
func (a *driver) List(ctx context.Context, opts adapter.ListOptions) (adapter.Page, error) {
	after := ""
	if opts.PageToken != "" {
		b, err := hex.DecodeString(opts.PageToken)
		if err != nil || len(b) == 0 || b[0] != '>' {
			return adapter.Page{}, &adapter.InvalidError{Detail: "page token not issued by this adapter"}
		}
		after = string(b[1:])
	}
	if err := a.lock(ctx); err != nil {
		return adapter.Page{}, err
	}
	defer a.mu.Unlock()
	if a.interruptList {
		a.interruptList = false
		return adapter.Page{}, &adapter.UnavailableError{Detail: "fake: listing interrupted mid-response"}
	}
	size := opts.PageSize
	if size == 0 {
		size = a.pageSize
	}
	names := slices.Sorted(maps.Keys(a.sandboxes))
	i, _ := slices.BinarySearch(names, after)
	if after != "" && i < len(names) && names[i] == after {
		i++
	}
	var p adapter.Page
	for _, n := range names[i:min(i+size, len(names))] {
		p.Handles = append(p.Handles, a.handle(a.sandboxes[n]))
	}
	if i+size < len(names) {
		p.NextPageToken = hex.EncodeToString([]byte(">" + names[i+size-1]))
	}
	return p, nil
}

// Destroy kills the sandbox's commands (their streams end with
// adapter.ErrLost) and forgets it. Absent, or another incarnation, is
// success.
func (a *driver) Destroy(ctx context.Context, h adapter.Handle) error {
	if err := a.lock(ctx); err != nil {
		return err
	}
	sb, ok := a.sandboxes[h.Name]
	if !ok || sb.id != h.ID {
		a.mu.Unlock()
		return nil
	}
	delete(a.sandboxes, h.Name)
	dones := sb.stopAll(true)
	a.mu.Unlock()
	return waitAll(ctx, dones)
}

func (sb *sandbox) stopAll(lost bool) []chan struct{} {
	var dones []chan struct{}
	for _, s := range sb.sessions {
		if s.ended() {
			continue
		}
		s.stop(lost)
		dones = append(dones, s.done)
	}
	return dones
}

func waitAll(ctx context.Context, dones []chan struct{}) error {
	for _, d := range dones {
		select {
		case <-d:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// Exec runs c and waits for its exit.
func (a *driver) Exec(ctx context.Context, h adapter.Handle, c adapter.Command) (adapter.Result, error) {
	sb, err := a.lockSandbox(ctx, h)
	if err != nil {
		return adapter.Result{}, err
	}
	s, err := a.start(sb, c, "", nil, true)
	a.mu.Unlock()
	if err != nil {
		return adapter.Result{}, err
	}
	select {
	case <-s.done:
	case <-ctx.Done():
		a.mu.Lock()
		s.stop(false)
		a.mu.Unlock()
		<-s.done
		return adapter.Result{}, fmt.Errorf("exec %v: %w", c, ctx.Err())
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if s.lost {
		return adapter.Result{}, fmt.Errorf("exec %v: %w", c, adapter.ErrLost)
	}
	return adapter.Result{Stdout: slices.Clone(s.out[0]), Stderr: slices.Clone(s.out[1]), Exit: *s.exit}, nil
}

// Spawn starts c as a session and returns a Stream from byte zero.
func (a *driver) Spawn(ctx context.Context, h adapter.Handle, c adapter.Command, opts adapter.SpawnOptions) (adapter.Stream, error) {
	sb, err := a.lockSandbox(ctx, h)
	if err != nil {
		return nil, err
	}
	defer a.mu.Unlock()
	if s, ok := sb.sessions[opts.SessionID]; ok && opts.SessionID != "" {
		if !reflect.DeepEqual(s.cmd, c) || (s.tty == nil) != (opts.TTY == nil) {
			return nil, &adapter.InvalidError{Detail: "session id " + opts.SessionID + " is in use by another command"}
		}
		return a.follow(s, adapter.Cursor{}, opts.Buffer), nil
	}
	s, err := a.start(sb, c, opts.SessionID, opts.TTY, false)
	if err != nil {
		return nil, err
	}
	return a.follow(s, adapter.Cursor{}, opts.Buffer), nil
}

// start registers and starts a process; a.mu is held.
func (a *driver) start(sb *sandbox, c adapter.Command, id string, tty *adapter.TTYSize, hidden bool) (*session, error) {
	if sb.suspended {
		return nil, &adapter.InvalidError{Detail: "sandbox " + sb.name + " is suspended"}
	}
	if id == "" {
		id = a.next("s-")
	}
	s := newSession(id, c, tty, hidden)
	sb.sessions[id] = s
	if !hidden {
		sb.order = append(sb.order, id)
	}
	p := &proc{a: a, sb: sb, s: s}
	a.procs.Add(1)
	go func() {
		defer a.procs.Done()
		p.main()
	}()
	return s, nil
}

// Attach follows session id from the cursor.
func (a *driver) Attach(ctx context.Context, h adapter.Handle, id string, from adapter.Cursor) (adapter.Stream, error) {
	s, err := a.lockSession(ctx, h, id)
	if err != nil {
		return nil, err
	}
	defer a.mu.Unlock()
	if from.Stdout > int64(len(s.out[0])) || from.Stderr > int64(len(s.out[1])) {
		return nil, &adapter.InvalidError{Detail: fmt.Sprintf("cursor %+v beyond the end (%d, %d)", from, len(s.out[0]), len(s.out[1]))}
	}
	return a.follow(s, from, 0), nil
}

func (sb *sandbox) session(id string) (*session, error) {
	s, ok := sb.sessions[id]
	if !ok || s.hidden {
		return nil, fmt.Errorf("session %s: %w", id, adapter.ErrNotFound)
	}
	return s, nil
}

// Sessions lists the sandbox's sessions in start order.
func (a *driver) Sessions(ctx context.Context, h adapter.Handle) ([]adapter.SessionInfo, error) {
	sb, err := a.lockSandbox(ctx, h)
	if err != nil {
		return nil, err
	}
	defer a.mu.Unlock()
	infos := make([]adapter.SessionInfo, 0, len(sb.order))
	for _, id := range sb.order {
		infos = append(infos, sb.sessions[id].info())
	}
	return infos, nil
}

// WriteStdin appends p to the session's stdin.
func (a *driver) WriteStdin(ctx context.Context, h adapter.Handle, id string, p []byte) error {
	s, err := a.lockSession(ctx, h, id)
	if err != nil {
		return err
	}
	defer a.mu.Unlock()
	switch {
	case s.ended():
		return fmt.Errorf("write stdin %s: %w", id, adapter.ErrCommandExited)
	case s.stdinClosed:
		return &adapter.WriteFailedError{Detail: "stdin of " + id + " is closed"}
	}
	s.stdin = append(s.stdin, p...)
	s.broadcast()
	return nil
}

// CloseStdin sends EOF once.
func (a *driver) CloseStdin(ctx context.Context, h adapter.Handle, id string) error {
	s, err := a.lockSession(ctx, h, id)
	if err != nil {
		return err
	}
	defer a.mu.Unlock()
	if s.ended() {
		return fmt.Errorf("close stdin %s: %w", id, adapter.ErrCommandExited)
	}
	s.stdinClosed = true
	s.broadcast()
	return nil
}

// Resize sets a TTY session's size.
func (a *driver) Resize(ctx context.Context, h adapter.Handle, id string, size adapter.TTYSize) error {
	s, err := a.lockSession(ctx, h, id)
	if err != nil {
		return err
	}
	defer a.mu.Unlock()
	switch {
	case s.tty == nil:
		return &adapter.InvalidError{Detail: "session " + id + " has no tty"}
	case s.ended():
		return fmt.Errorf("resize %s: %w", id, adapter.ErrCommandExited)
	}
	*s.tty = size
	return nil
}

// TerminateSession sends SIGTERM, then SIGKILL after grace, and returns the
// recorded exit.
func (a *driver) TerminateSession(ctx context.Context, h adapter.Handle, id string, grace time.Duration) (adapter.Exit, error) {
	s, err := a.lockSession(ctx, h, id)
	if err != nil {
		return adapter.Exit{}, err
	}
	if !s.ended() {
		s.terminating = true
		s.signal(sigTERM)
	}
	a.mu.Unlock()
	timer := time.AfterFunc(grace, func() {
		a.mu.Lock()
		s.signal(sigKILL)
		a.mu.Unlock()
	})
	defer timer.Stop()
	select {
	case <-s.done:
	case <-ctx.Done():
		return adapter.Exit{}, &adapter.UnavailableError{Detail: "terminate " + id + ": outcome uncertain: " + ctx.Err().Error()}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if s.lost {
		return adapter.Exit{}, fmt.Errorf("terminate %s: %w", id, adapter.ErrLost)
	}
	return *s.exit, nil
}
