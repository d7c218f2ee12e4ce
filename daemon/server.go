package daemon

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/agentrunner/runner/daemon/apierr"
	"github.com/agentrunner/runner/daemon/internal/life"
	"github.com/agentrunner/runner/daemon/preview"
	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/daemon/sandboxes"
	"github.com/agentrunner/runner/daemon/sessions"
	"github.com/agentrunner/runner/internal/keyed"
	"github.com/agentrunner/runner/wire"
)

// server holds what every handler needs. Its fields are set once in Run
// and read-only afterwards, except where a field's comment says otherwise.
type server struct {
	cfg     Config
	log     *slog.Logger
	token   string
	reg     *registry.Registry
	metrics *metrics
	locks   *keyed.Mutex
	mux     *http.ServeMux
	preview *preview.Server    // nil without a preview listener
	sbx     *sandboxes.Manager // the sandboxes: lifecycle, identity, cgroups, network, checkpoints
	ssn     *sessions.Manager  // the sessions: spawn, exec, readers, control, bounds, the shim gateway
	adm     admission          // creates in flight under Config.Capacity (capacity.go)

	// life ends when Run begins shutting down and counts the long-lived
	// handlers and the work run later, so Run can wait for them. Owned
	// by Run.
	life *life.Life
}

// newServer returns a server with its lifetime begun and its
// per-server state made; Run sets the rest.
func newServer(cfg Config, reg *registry.Registry) *server {
	lt := life.New()
	s := &server{
		cfg:     cfg,
		log:     cfg.Logger,
		reg:     reg,
		metrics: newMetrics(cfg.Version),
		locks:   &keyed.Mutex{},
		life:    lt,
	}
	s.sbx = sandboxes.New(lt.Context(), cfg.sandboxes(), cfg.Logger, reg, s.locks, s.metrics)
	s.ssn = sessions.New(cfg.sessions(), cfg.Logger, reg, s.sbx, lt, s.metrics, &s.adm)
	s.sbx.SetSessions(s.ssn)
	return s
}

func (s *server) routes() {
	m := http.NewServeMux()
	m.HandleFunc("GET /healthz", s.handleHealth)
	m.HandleFunc("GET /metrics", s.handleMetrics)
	m.HandleFunc("GET /v1/capabilities", s.handleCapabilities)
	m.HandleFunc("GET /v1/capacity", s.handleCapacity)
	m.HandleFunc("GET /v1/info", s.handleInfo) // info.go

	m.HandleFunc("POST /v1/sandboxes", s.admitSandbox(s.handleCreateSandbox))
	m.HandleFunc("GET /v1/sandboxes", s.handleListSandboxes)
	m.HandleFunc("GET /v1/sandboxes/{name}", s.scoped(s.handleGetSandbox))
	m.HandleFunc("DELETE /v1/sandboxes/{name}", s.scoped(s.handleDeleteSandbox))
	m.HandleFunc("POST /v1/sandboxes/{name}/suspend", s.scoped(s.handleSuspend))
	m.HandleFunc("POST /v1/sandboxes/{name}/resume", s.scoped(s.handleResume))
	m.HandleFunc("PUT /v1/sandboxes/{name}/network", s.scoped(s.handleNetwork))
	m.HandleFunc("PUT /v1/sandboxes/{name}/limits", s.scoped(s.handleLimits))
	m.HandleFunc("POST /v1/sandboxes/{name}/urls", s.scoped(s.handleURLs))
	m.HandleFunc("POST /v1/sandboxes/{name}/checkpoints", s.scoped(s.handleCreateCheckpoint))
	m.HandleFunc("GET /v1/sandboxes/{name}/checkpoints", s.scoped(s.handleListCheckpoints))
	m.HandleFunc("GET /v1/sandboxes/{name}/checkpoints/{id}", s.scoped(s.handleGetCheckpoint))
	m.HandleFunc("DELETE /v1/sandboxes/{name}/checkpoints/{id}", s.scoped(s.handleDeleteCheckpoint))
	m.HandleFunc("POST /v1/sandboxes/{name}/checkpoints/{id}/restore", s.scoped(s.handleRestore))
	m.HandleFunc("GET /v1/sandboxes/{name}/checkpoints/{id}/archive", s.scoped(s.handleExportCheckpoint))
	m.HandleFunc("POST /v1/sandboxes/{name}/checkpoints/import", s.scoped(s.handleImportCheckpoint))
	m.HandleFunc("GET /v1/sandboxes/{name}/session-archive", s.scoped(s.handleExportSessions))  // sessionarchive.go
	m.HandleFunc("POST /v1/sandboxes/{name}/session-archive", s.scoped(s.handleImportSessions)) // sessionarchive.go

	m.HandleFunc("POST /v1/sandboxes/{name}/sessions", s.scoped(s.admitSession(s.handleCreateSession)))
	m.HandleFunc("GET /v1/sandboxes/{name}/sessions", s.scoped(s.handleListSessions))
	m.HandleFunc("GET /v1/sandboxes/{name}/sessions/{id}", s.scoped(s.handleGetSession))
	m.HandleFunc("GET /v1/sandboxes/{name}/sessions/{id}/attach", s.scoped(s.handleAttach))
	m.HandleFunc("GET /v1/sandboxes/{name}/sessions/{id}/streams/{stream}", s.scoped(s.handleStream))
	m.HandleFunc("GET /v1/sandboxes/{name}/sessions/{id}/marks", s.scoped(s.handleMarks)) // streams.go
	m.HandleFunc("POST /v1/sandboxes/{name}/sessions/{id}/stdin", s.scoped(s.handleStdin))
	m.HandleFunc("POST /v1/sandboxes/{name}/sessions/{id}/close-stdin", s.scoped(s.handleCloseStdin))
	m.HandleFunc("POST /v1/sandboxes/{name}/sessions/{id}/resize", s.scoped(s.handleResize))
	m.HandleFunc("POST /v1/sandboxes/{name}/sessions/{id}/signal", s.scoped(s.handleSignal))
	m.HandleFunc("POST /v1/sandboxes/{name}/sessions/{id}/terminate", s.scoped(s.handleTerminate))
	m.HandleFunc("DELETE /v1/sandboxes/{name}/sessions/{id}", s.scoped(s.handleDeleteSession))
	m.HandleFunc("POST /v1/sandboxes/{name}/exec", s.scoped(s.handleExec))
	s.mux = m
}

// scoped wraps a /v1/sandboxes/{name}/... handler with the incarnation
// check: a request that names an incarnation (query "incarnation") that is
// not the live sandbox's is answered 404 not_found, or 204 for a DELETE
// (absent is success), and never reaches the handler. Handlers that act on
// the sandbox check again where they hold its lock or its record
// (checkIncarnation), so a destroy and re-create between this check and
// the act still never touches the newer sandbox.
func (s *server) scoped(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		inc := r.URL.Query().Get(wire.QueryIncarnation)
		if inc == "" {
			h(w, r)
			return
		}
		ctx := sandboxes.WithIncarnation(r.Context(), inc)
		r = r.WithContext(ctx)
		if _, err := s.sbx.Scoped(ctx, r.PathValue("name")); err != nil {
			var ae *apierr.Error
			if r.Method == http.MethodDelete && errors.As(err, &ae) && ae.Code == wire.CodeNotFound {
				w.WriteHeader(http.StatusNoContent)
				return
			}
			s.writeError(w, r, err)
			return
		}
		h(w, r)
	}
}

var routeMethods = []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete}

// ServeHTTP serves a request on the API listeners: with its request id,
// log line and latency (serveLogged, requests.go), authenticated, routed.
func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.serveLogged(w, r, s.serveAPI)
}

// serveAPI authenticates, then routes. Unknown routes answer 404 invalid
// ("no such route") and wrong methods 405 invalid: never not_found, which
// is reserved for the registry's definitive absence.
func (s *server) serveAPI(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/healthz" && !tokenMatches(r.Header.Get("Authorization"), s.token) {
		s.writeError(w, r, apierr.Denied)
		return
	}
	if _, pattern := s.mux.Handler(r); pattern == "" {
		for _, m := range routeMethods {
			r2 := r.Clone(r.Context())
			r2.Method = m
			if _, p := s.mux.Handler(r2); p != "" {
				w.Header().Set("Allow", m)
				s.writeError(w, r, &apierr.Error{Status: http.StatusMethodNotAllowed, Code: wire.CodeInvalid, Detail: "method not allowed"})
				return
			}
		}
		s.writeError(w, r, apierr.NoRoute)
		return
	}
	s.mux.ServeHTTP(w, r) // sets the path values Handler does not
}

// writeJSON writes v as a complete JSON body with a Content-Length, so a
// cut body fails to decode on the client.
func (s *server) writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		s.log.Error("encode response", "err", err)
		http.Error(w, "encode response", http.StatusInternalServerError)
		return
	}
	body = append(body, '\n')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	w.Write(body)
}

// decodeJSON reads a bounded JSON body into v, rejecting unknown fields,
// duplicate keys and trailing data. An empty body decodes as {} when allowEmpty.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any, allowEmpty bool) error {
	body := http.MaxBytesReader(w, r.Body, wire.MaxJSONBody)
	raw, err := io.ReadAll(body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return apierr.TooLarge(mbe.Limit)
		}
		return apierr.Invalid("read body: %v", err)
	}
	if len(raw) == 0 && allowEmpty {
		return nil
	}
	if err := duplicateKey(raw); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return apierr.Invalid("decode body: %v", err)
	}
	if dec.More() {
		return apierr.Invalid("decode body: trailing data")
	}
	return nil
}

// duplicateKey refuses a body in which an object names a key twice:
// encoding/json keeps the last silently, so {"argv":["ls"],"argv":["rm"]}
// would mean whatever the last proxy or logger in the path did not show.
// Keys are compared as encoding/json matches them to struct fields, case
// insensitively (no request body holds a map, whose keys would be exact).
// One pass over the tokens, before Decode; a syntax error is left to
// Decode, which says where it is.
func duplicateKey(raw []byte) error {
	type frame struct {
		keys    map[string]struct{} // nil for an array
		wantKey bool                // the next token of this object is a key or '}'
	}
	var stack []*frame
	dec := json.NewDecoder(bytes.NewReader(raw))
	for {
		tok, err := dec.Token()
		if err != nil {
			return nil // io.EOF, or a syntax error Decode reports
		}
		var top *frame
		if n := len(stack); n > 0 {
			top = stack[n-1]
		}
		if top != nil && top.keys != nil && top.wantKey {
			if tok == json.Delim('}') {
				stack = stack[:len(stack)-1]
				continue
			}
			key, _ := tok.(string)
			folded := strings.ToLower(key)
			if _, dup := top.keys[folded]; dup {
				return apierr.Invalid("decode body: duplicate key %q", key)
			}
			top.keys[folded] = struct{}{}
			top.wantKey = false
			continue
		}
		// A value: after it, an enclosing object expects a key again.
		if top != nil && top.keys != nil {
			top.wantKey = true
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{keys: map[string]struct{}{}, wantKey: true})
		case json.Delim('['):
			stack = append(stack, &frame{})
		case json.Delim(']'), json.Delim('}'):
			if len(stack) > 0 {
				stack = stack[:len(stack)-1]
			}
		}
	}
}

func (s *server) handleHealth(w http.ResponseWriter, r *http.Request) {
	s.writeJSON(w, http.StatusOK, wire.Health{Status: "ok", Version: s.cfg.Version})
}

func (s *server) handleCapabilities(w http.ResponseWriter, r *http.Request) {
	s.writeJSON(w, http.StatusOK, wire.Capabilities{Capabilities: s.capabilities()})
}

// capabilities is what this host delivers, sorted.
func (s *server) capabilities() []string {
	// Only what this host delivers: no network_policy unless egress is
	// enforced, no public_url without a preview listener.
	caps := []string{wire.CapAttach, wire.CapSuspend, wire.CapTerminateSession, wire.CapTTY}
	if s.preview != nil {
		caps = append(caps, wire.CapPublicURL)
	}
	if s.sbx.NetPolicy() != nil {
		caps = append(caps, wire.CapNetworkPolicy)
	}
	if s.sbx.Cgroups() != nil {
		caps = append(caps, wire.CapResourceLimits)
	}
	if s.sbx.CanCheckpoint() == nil { // checkpoints.go
		caps = append(caps, wire.CapCheckpoint, wire.CapFork)
	}
	slices.Sort(caps)
	return caps
}
