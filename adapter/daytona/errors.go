package daytona

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/hosted/httpcall"
)

// provider names this adapter in *adapter.ProviderError.
const provider = "daytona"

// ErrNameTaken is matched (errors.Is) by the error of [Client.Create] when
// the API answered 409: a sandbox with that name exists (possibly one this
// caller created before a lost answer). Its taxonomy kind is invalid; the
// layer above adopts the sandbox by getting it by name.
var ErrNameTaken = errors.New("sandbox name taken")

// Error is the detail of a failed call, beneath its taxonomy kind (the
// hosted providers' one error type): Status, OwnBody and OwnStatus let the
// layer above tell answers apart that share a kind (a toolbox session the
// daemon does not know, 404, from another provider failure) without
// matching text. OwnStatus is, for an answer the toolbox daemon gave (its
// JSON error body, or the empty body of gin's AbortWithError on a 400 or
// 404), the status its answer means: Status, or the status the message's
// common-go prefix names when the daemon wrapped a typed error into a 500
// ("failed to execute command: not found: session not found" means 404).
type Error = httpcall.Error

// fail is the failure of opName, of kind (status 0: no answer arrived).
func fail(opName string, status int, kind error) *Error {
	return httpcall.NewError(provider, opName, status, kind)
}

// IsToolboxNotFound reports whether err is the toolbox daemon's own "not
// found": no such session or command (a 404, or the 500 an exec answers
// for an unknown session), or no such file (a 404 with an empty body). It
// says nothing about the sandbox, so its taxonomy kind is provider (a
// session or command) or invalid (a file the caller named), never
// not_found.
func IsToolboxNotFound(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.OwnStatus == http.StatusNotFound && strings.HasPrefix(e.Op, "toolbox ")
}

// IsSessionExists reports whether err is the toolbox daemon's 409 on
// session create: the session id is taken (the caller may have created it
// before a lost answer).
func IsSessionExists(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.OwnStatus == http.StatusConflict && strings.HasPrefix(e.Op, "toolbox create session")
}

// isDaemonAnswer reports whether err is an answer of the toolbox daemon
// itself (not a proxy's, not a transport failure): the daemon refused or
// failed the call after reading it.
func isDaemonAnswer(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.OwnStatus != 0
}

// The calls the error table tells apart: a GET of a sandbox may turn a
// 404 into adapter.ErrNotFound (the documented definitive answer), a
// create turns 409 into ErrNameTaken, and a toolbox call reads the
// daemon's codes.
const (
	opOther httpcall.Op = 1 << iota
	opGetSandbox
	opCreate
	opToolbox
	// opToolboxFile is a toolbox files call: its 404 is a path the caller
	// named that is not there (invalid), not a session the daemon lost.
	opToolboxFile
)

// errorBody is the error body of the API (NestJS: {statusCode, message,
// error}) and of the toolbox daemon (common-go: {statusCode, message,
// code, ...}). message may be a string or, for validation errors, a list.
type errorBody struct {
	StatusCode *int            `json:"statusCode"`
	Message    json.RawMessage `json:"message"`
}

// text returns the body's message as one string.
func (b errorBody) text() string {
	var s string
	if json.Unmarshal(b.Message, &s) == nil {
		return s
	}
	var l []string
	if json.Unmarshal(b.Message, &l) == nil {
		return strings.Join(l, "; ")
	}
	return ""
}

// parseErrorBody reports whether raw is the provider's own error body for
// an answer of this status: a proxy or load balancer in front answers with
// another shape (or with the same shape and another status: never trusted).
func parseErrorBody(raw []byte, status int) (string, bool) {
	var b errorBody
	if json.Unmarshal(raw, &b) != nil || b.StatusCode == nil || *b.StatusCode != status || len(b.Message) == 0 {
		return "", false
	}
	return b.text(), true
}

// ginNotFound is the body gin answers for a route it does not have.
const ginNotFound = "404 page not found"

// commonGoPrefixes are the prefixes the toolbox daemon's typed errors
// (daytonaio/common-go pkg/errors: NewNotFoundError, ...) put in front of
// their message, and the status each one is answered with when it reaches
// the error middleware unwrapped. A handler that wraps one (the session
// exec handler's fmt.Errorf("failed to execute command: %w")) turns it into
// a 500 whose message still carries the prefix: the only place the
// daemon's classification survives, so it is read from there.
var commonGoPrefixes = map[string]int{
	"not found":            http.StatusNotFound,
	"conflict":             http.StatusConflict,
	"gone":                 http.StatusGone,
	"bad request":          http.StatusBadRequest,
	"invalid body request": http.StatusBadRequest,
	"unauthorized":         http.StatusUnauthorized,
	"forbidden":            http.StatusForbidden,
	"request timeout":      http.StatusRequestTimeout,
	"unprocessable entity": http.StatusUnprocessableEntity,
}

// prefixStatus returns the status named by the first common-go prefix in
// a wrapped message ("failed to execute command: not found: ..."), 0 when
// it has none.
func prefixStatus(msg string) int {
	for _, part := range strings.Split(msg, ": ") {
		if st, ok := commonGoPrefixes[part]; ok {
			return st
		}
	}
	return 0
}

// daemonStatus judges a toolbox answer: the status it means when the
// toolbox daemon gave it, 0 when it did not (a proxy, a load balancer).
func daemonStatus(status int, raw []byte, own bool, msg string) int {
	switch {
	case own && status == http.StatusInternalServerError:
		if st := prefixStatus(msg); st != 0 {
			return st
		}
		return status
	case own:
		return status
	case len(raw) == 0 && (status == http.StatusBadRequest || status == http.StatusNotFound):
		// gin's AbortWithError writes the status and no body: the
		// daemon's upload, download and exec-binding failures.
		return status
	}
	return 0
}

// noRoute marks gin's answer for a route the daemon does not have (an
// older or newer daemon, a wrong URL): asking again gets the same.
const noRoute = "no route"

// table is Daytona's error table. Rows match the status the answer
// means (Error.OwnStatus for the toolbox daemon's own answers).
var table = httpcall.Table{Provider: provider, Rules: []httpcall.Rule{
	{Status: []int{429}, Kind: adapter.KindRateLimited},
	{Status: []int{401, 403}, Kind: adapter.KindDenied},
	{Ops: opToolbox | opToolboxFile, Code: []string{noRoute}, Kind: adapter.KindProvider, Note: ": the toolbox has no such route"},
	// A proxy's answer (the toolbox proxy gives 502 for a sandbox it
	// cannot reach), a 404 from a wrong URL, a 5xx page: it proves
	// nothing about the sandbox.
	{Own: httpcall.ForeignBody, Kind: adapter.KindUnavailable},
	{Ops: opGetSandbox, Status: []int{404}, Kind: adapter.KindNotFound},
	// A path the caller named is not there.
	{Ops: opToolboxFile, Status: []int{404}, Kind: adapter.KindInvalid},
	{Ops: opCreate, Status: []int{409}, Kind: adapter.KindInvalid, Cause: ErrNameTaken},
	// Input to a command that already completed.
	{Ops: opToolbox | opToolboxFile, Status: []int{410}, Kind: adapter.KindCommandExited},
	{Status: []int{400, 409, 422}, Kind: adapter.KindInvalid},
	{Status: []int{408, 502, 503, 504}, Kind: adapter.KindUnavailable},
	// 404 of anything but GET sandbox (delete, stop, a toolbox session:
	// confirm with Get), 500 with the provider's body, other codes.
}}

// statusError maps an answer that is not a success.
func statusError(opName string, kind httpcall.Op, status int, h http.Header, raw []byte, red httpcall.Redactor) error {
	msg, own := parseErrorBody(raw, status)
	e := &Error{Op: opName, Status: status, OwnBody: own, Message: red.Clean(msg)}
	a := httpcall.Answer{Op: kind, Status: status, Detail: httpcall.Detail(status, "", e.Message), RetryAfter: httpcall.RetryAfter(h)}
	if kind&(opToolbox|opToolboxFile) != 0 {
		e.OwnStatus = daemonStatus(status, raw, own, msg)
		if e.OwnStatus != 0 {
			a.Status, own = e.OwnStatus, true
		}
		if !own && status == http.StatusNotFound && strings.TrimSpace(string(raw)) == ginNotFound {
			a.Code = noRoute
		}
	}
	a.Own = own
	return table.Classify(e, a)
}

func invalid(detail string) error     { return &adapter.InvalidError{Detail: detail} }
func unavailable(detail string) error { return &adapter.UnavailableError{Detail: detail} }
