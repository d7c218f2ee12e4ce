package e2b

import (
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/hosted/httpcall"
)

// provider names this adapter in *adapter.ProviderError.
const provider = "e2b"

// Error is the detail of a failed call, beneath its taxonomy kind (the
// hosted providers' one error type): Status and Code let the layer above
// tell answers apart that share a kind (a process envd does not know from
// another provider failure) without matching text. Code is the Connect
// error code for envd ("not_found", "unknown") or the control plane's
// numeric code as text.
type Error = httpcall.Error

// fail is the failure of op, of kind (status 0: no answer arrived).
func fail(op string, status int, kind error) *Error {
	return httpcall.NewError(provider, op, status, kind)
}

// The Connect protocol's error codes (connectrpc.com/docs/protocol, "Error
// Codes"), as they appear in envd's error bodies and end-stream messages.
const (
	CodeCanceled           = "canceled"
	CodeUnknown            = "unknown"
	CodeInvalidArgument    = "invalid_argument"
	CodeDeadlineExceeded   = "deadline_exceeded"
	CodeNotFound           = "not_found"
	CodeAlreadyExists      = "already_exists"
	CodePermissionDenied   = "permission_denied"
	CodeResourceExhausted  = "resource_exhausted"
	CodeFailedPrecondition = "failed_precondition"
	CodeAborted            = "aborted"
	CodeOutOfRange         = "out_of_range"
	CodeUnimplemented      = "unimplemented"
	CodeInternal           = "internal"
	CodeUnavailable        = "unavailable"
	CodeDataLoss           = "data_loss"
	CodeUnauthenticated    = "unauthenticated"
)

// IsProcessNotFound reports whether err is envd's own answer that no
// process matches the selector (Connect code not_found in envd's error
// body). It says nothing about the sandbox, so its taxonomy kind is
// provider, never not_found: the layer above decides what a vanished
// process means.
func IsProcessNotFound(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == CodeNotFound && strings.HasPrefix(e.Op, "envd ")
}

// The control-plane calls the error table tells apart: only a GET of a sandbox may
// turn a 404 into adapter.ErrNotFound (the documented definitive answer).
const (
	opOther httpcall.Op = 1 << iota
	opGetSandbox
)

// apiErrorBody is the control plane's Error schema: {code, message}.
type apiErrorBody struct {
	Code    *int    `json:"code"`
	Message *string `json:"message"`
}

// apiTable is the control plane's error table. A 404 without the API's
// error body is a proxy or a wrong URL, not the API's verdict.
var apiTable = httpcall.Table{Provider: provider, Rules: []httpcall.Rule{
	{Ops: opGetSandbox, Status: []int{404}, Own: httpcall.OwnBody, Kind: adapter.KindNotFound},
	// Delete, pause or resume of an absent id: the API said so, but the
	// contract reserves not_found for GET; confirm with Get.
	{Status: []int{404}, Own: httpcall.OwnBody, Kind: adapter.KindProvider},
	{Status: []int{429}, Kind: adapter.KindRateLimited},
	{Status: []int{401, 403}, Kind: adapter.KindDenied},
	{Status: []int{400, 409}, Kind: adapter.KindInvalid},
	{Min: 500, Kind: adapter.KindUnavailable},
	{Status: []int{404, 408}, Kind: adapter.KindUnavailable},
}}

// apiStatusError maps a control-plane answer that is not a success.
// hasBody says the body parsed as E2B's Error schema.
func apiStatusError(op string, kind httpcall.Op, status int, h http.Header, body apiErrorBody, hasBody bool, red httpcall.Redactor) error {
	e := &Error{Op: op, Status: status, OwnBody: hasBody}
	if hasBody {
		if body.Code != nil {
			e.Code = strconv.Itoa(*body.Code)
		}
		if body.Message != nil {
			e.Message = red.Clean(*body.Message)
		}
	}
	return apiTable.Classify(e, httpcall.Answer{Op: kind, Status: status, Own: hasBody,
		Detail: httpcall.Detail(status, "", e.Message), RetryAfter: httpcall.RetryAfter(h)})
}

// connectStatusCode is the Connect protocol's HTTP-status-to-code table,
// used when a unary answer or a stream's headers carry no Connect body
// (a proxy spoke, not envd).
func connectStatusCode(status int) string {
	switch status {
	case http.StatusBadRequest:
		return CodeInternal
	case http.StatusUnauthorized:
		return CodeUnauthenticated
	case http.StatusForbidden:
		return CodePermissionDenied
	case http.StatusNotFound:
		return CodeUnimplemented
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return CodeUnavailable
	}
	return CodeUnknown
}

// connectTable is envd's (or its proxy's) error table.
var connectTable = httpcall.Table{Provider: provider, Rules: []httpcall.Rule{
	{Status: []int{429}, Kind: adapter.KindRateLimited},
	{Code: []string{CodeResourceExhausted}, Kind: adapter.KindRateLimited},
	// A proxy's answer (E2B's edge gives 502 for a sandbox it cannot
	// reach) proves nothing about the sandbox or the process.
	{Own: httpcall.ForeignBody, Status: []int{401, 403}, Kind: adapter.KindDenied},
	{Own: httpcall.ForeignBody, Kind: adapter.KindUnavailable},
	{Code: []string{CodeUnauthenticated, CodePermissionDenied}, Kind: adapter.KindDenied},
	{Code: []string{CodeInvalidArgument, CodeFailedPrecondition, CodeOutOfRange, CodeAlreadyExists}, Kind: adapter.KindInvalid},
	{Code: []string{CodeUnavailable, CodeDeadlineExceeded, CodeAborted, CodeCanceled}, Kind: adapter.KindUnavailable},
	{Code: []string{CodeUnimplemented}, Kind: adapter.KindNotSupported},
	// not_found (a process, see IsProcessNotFound), unknown, internal,
	// data_loss: envd answered and the answer fits no other kind.
}}

// connectError maps envd's (or its proxy's) answer into the taxonomy.
// fromEnvd says the code came from a Connect error body, not from the HTTP
// status of a proxy; h may be nil.
func connectError(op string, status int, h http.Header, code, message string, fromEnvd bool, red httpcall.Redactor) error {
	e := &Error{Op: op, Status: status, Message: red.Clean(message), OwnBody: fromEnvd}
	if fromEnvd {
		e.Code = code
	}
	return connectTable.Classify(e, httpcall.Answer{Status: status, Own: fromEnvd, Code: code,
		Detail: httpcall.Detail(status, code, e.Message), RetryAfter: httpcall.RetryAfter(h)})
}
