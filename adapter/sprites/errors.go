package sprites

import (
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/hosted/httpcall"
)

// provider names this client in *adapter.ProviderError.
const provider = "sprites"

// notFoundError is the "error" field of the API's answer to GET of a sprite
// that does not exist (and to DELETE of one). It is the API's verdict, a
// protocol constant like an error code; a 404 of any other shape (a proxy,
// a wrong route) proves nothing about the sprite.
const notFoundError = "sprite not found"

var (
	// ErrCreateConflict is returned by [Client.Create] when the API refused
	// the create with 409, or with 400 (the API answers a name that already
	// exists with either). The name may be taken: Get it, and adopt the
	// sprite if it exists; if Get says not found, the create was invalid.
	// Its taxonomy kind is invalid.
	ErrCreateConflict = errors.New("create refused: the name may already exist")

	// ErrNoExit is returned by [Session.Recv] (and [Client.Run]) when the
	// exec WebSocket closed before an exit frame arrived. Sprites closes
	// about 30 % of fast commands with status 1000 and no exit frame: the
	// command's exit is unknown, never 0. Its taxonomy kind is unavailable,
	// with Uncertain set.
	ErrNoExit = errors.New("exec ended without an exit frame")

	// ErrNoCheckpoint is wrapped when the API answers 404 for a
	// checkpoint id of a sprite that exists (kind invalid, never
	// not_found: that speaks only of the sprite).
	ErrNoCheckpoint = errors.New("no such checkpoint")

	// ErrWriteDenied is wrapped by [Client.WriteFile] when the API
	// answers 403: fs/write has no asRoot flag and writes as the sprite
	// user, who may not write the path (kind provider, never denied).
	ErrWriteDenied = errors.New("fs/write may not write the path")

	// ErrNoFile is returned by [Client.ReadFile] when the API answered 404
	// with its own error body: no such file (or no such sprite; Get tells
	// them apart). Its taxonomy kind is provider.
	ErrNoFile = errors.New("no such file")

	// ErrNoSession is returned by [Client.Kill] when the API answered 404
	// with its own error body: no such exec session (or no such sprite; Get
	// tells them apart). Its taxonomy kind is provider.
	ErrNoSession = errors.New("no such exec session")
)

// Error is the detail of a failed call, beneath its taxonomy kind (the
// hosted providers' one error type): errors.Is and errors.As reach the
// adapter error (for example *adapter.RateLimitedError) and this
// package's sentinels through Unwrap. Code is the API's machine-readable
// "error" field, when it sent one.
type Error = httpcall.Error

// fail is the failure of op, of kind (status 0: no answer arrived).
func fail(op string, status int, kind error) *Error {
	return httpcall.NewError(provider, op, status, kind)
}

// The calls the error table tells apart: only a GET of a sprite may turn
// a 404 into adapter.ErrNotFound (the documented definitive answer).
const (
	opOther httpcall.Op = 1 << iota
	opGetSprite
	opCreate
	opDelete
	opReadFile
	opWriteFile
	opCheckpoint
)

// parseErrorBody decodes an error answer's body; ok is false when it is
// not the API's {error, message} (a proxy's page, nothing at all).
func parseErrorBody(raw []byte) (eb apiErrorBody, ok bool) {
	ok = json.Unmarshal(raw, &eb) == nil && (eb.Error != "" || eb.Message != "")
	return eb, ok
}

// apiErrorBody is the API's error answer (sprites-go errors.go: APIError).
type apiErrorBody struct {
	Error             string `json:"error"`
	Message           string `json:"message"`
	RetryAfterSeconds int    `json:"retry_after_seconds"`
}

// table is the Sprites API's error table. A 404 is the API's verdict
// only with its own body; rows with Code notFoundError match that body.
var table = httpcall.Table{Provider: provider, Rules: []httpcall.Rule{
	{Ops: opGetSprite, Status: []int{404}, Own: httpcall.OwnBody, Code: []string{notFoundError}, Kind: adapter.KindNotFound},
	{Ops: opReadFile, Status: []int{404}, Own: httpcall.OwnBody, Kind: adapter.KindProvider, Cause: ErrNoFile},
	// The API said so, but the contract reserves not_found for GET of the
	// sprite; the caller confirms with Get.
	{Status: []int{404}, Own: httpcall.OwnBody, Code: []string{notFoundError}, Kind: adapter.KindProvider},
	// The sprite answered; the checkpoint is not one of its own.
	{Ops: opCheckpoint, Status: []int{404}, Own: httpcall.OwnBody, Kind: adapter.KindInvalid, Cause: ErrNoCheckpoint},
	{Status: []int{429}, Kind: adapter.KindRateLimited},
	// fs/write runs as the sprite user: a 403 is a path that user may not
	// write, not a bad token (which is 401 everywhere).
	{Ops: opWriteFile, Status: []int{403}, Kind: adapter.KindProvider, Cause: ErrWriteDenied, Note: " (fs/write runs as the sprite user)"},
	{Status: []int{413}, Kind: adapter.KindInvalid},
	{Status: []int{401, 403}, Kind: adapter.KindDenied},
	{Ops: opCreate, Status: []int{400, 409}, Kind: adapter.KindInvalid, Cause: ErrCreateConflict},
	{Status: []int{400, 409, 422}, Kind: adapter.KindInvalid},
	// A 502 from Fly's proxy, a 503 in an outage, a 404 that is not the
	// API's body: nothing is proven about the sprite.
	{Min: 500, Kind: adapter.KindUnavailable},
	{Status: []int{404, 408}, Kind: adapter.KindUnavailable},
}}

// apiStatusError maps an answer that is not a success. hasBody says the
// body parsed as the API's error object.
func apiStatusError(op string, kind httpcall.Op, status int, h http.Header, body apiErrorBody, hasBody bool, red httpcall.Redactor) error {
	e := &Error{Op: op, Status: status, OwnBody: hasBody}
	a := httpcall.Answer{Op: kind, Status: status, Own: hasBody, RetryAfter: httpcall.RetryAfter(h)}
	if hasBody {
		e.Code = red.Clean(body.Error)
		e.Message = red.Clean(body.Message)
		a.Code = body.Error
		if a.RetryAfter == 0 && body.RetryAfterSeconds > 0 {
			a.RetryAfter = time.Duration(body.RetryAfterSeconds) * time.Second
		}
	}
	a.Detail = httpcall.Detail(status, e.Code, e.Message)
	return table.Classify(e, a)
}

func invalid(detail string) error     { return &adapter.InvalidError{Detail: detail} }
func unavailable(detail string) error { return &adapter.UnavailableError{Detail: detail} }
