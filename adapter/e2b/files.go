package e2b

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"

	"github.com/agentrunner/runner/adapter/hosted/httpcall"
)

// MaxReadFile bounds ReadFile: it is for small files (versions, checksums,
// exit records), not bulk transfer.
const MaxReadFile = 16 << 20

// WriteFile uploads r as the file at path, creating parent directories and
// replacing an existing file (envd's POST /files, multipart/form-data, from
// e2b-dev/infra packages/envd/spec/envd.yaml). A relative path is resolved
// against the user's home. envd does not set modes: make a binary
// executable with a process (chmod) afterwards.
//
// It owns one goroutine, which encodes r into the request body, and waits
// for it before returning.
func (e *Envd) WriteFile(ctx context.Context, path string, r io.Reader) error {
	const op = "envd write file"
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	done := make(chan struct{})
	go func() {
		defer close(done)
		part, err := mw.CreateFormFile("file", "file")
		if err == nil {
			_, err = io.Copy(part, r)
		}
		if err == nil {
			err = mw.Close()
		}
		pw.CloseWithError(err)
	}()
	_, err := e.files(ctx, &httpcall.Request{Op: op, Method: http.MethodPost, URL: "/files", Query: e.filesQuery(path),
		Body: pr, ContentType: mw.FormDataContentType()})
	// Unblock the encoder if the exchange ended before it finished.
	pr.CloseWithError(io.ErrClosedPipe)
	<-done
	return err
}

// ReadFile downloads the file at path (envd's GET /files), at most
// MaxReadFile bytes; a longer file is *adapter.InvalidError.
func (e *Envd) ReadFile(ctx context.Context, path string) ([]byte, error) {
	const op = "envd read file"
	return e.files(ctx, &httpcall.Request{Op: op, Method: http.MethodGet, URL: "/files", Query: e.filesQuery(path)})
}

func (e *Envd) filesQuery(path string) url.Values {
	q := url.Values{"path": {path}}
	if e.user != "" {
		q.Set("username", e.user)
	}
	return q
}

// files sends a files request and maps its answer. envd answers with the
// Error schema of envd.yaml ({code, message}); without it a proxy spoke.
func (e *Envd) files(ctx context.Context, r *httpcall.Request) ([]byte, error) {
	r.MaxBody, r.OK, r.Fail = MaxReadFile+1, []int{http.StatusOK}, func(status int, h http.Header, raw []byte, red httpcall.Redactor) error {
		return filesError(r.Op, status, h, raw, red)
	}
	rep, err := e.call.Do(ctx, r)
	if err != nil {
		return nil, err
	}
	if len(rep.Body) > MaxReadFile {
		return nil, fail(r.Op, rep.Status, invalid(fmt.Sprintf("file exceeds %d bytes", MaxReadFile)))
	}
	return rep.Body, nil
}

// filesError maps a files answer that is not a success.
func filesError(op string, status int, h http.Header, raw []byte, red httpcall.Redactor) error {
	var eb apiErrorBody
	hasBody := isContentType(h, contentTypeUnary) && json.Unmarshal(raw, &eb) == nil && eb.Code != nil && eb.Message != nil
	if hasBody && status >= 500 {
		// envd itself failed (a full disk is 507): an answer, not an outage.
		msg := red.Clean(*eb.Message)
		err := fail(op, status, providerErr(httpcall.Detail(status, "", msg)))
		err.Code, err.Message, err.OwnBody = fmt.Sprint(*eb.Code), msg, true
		return err
	}
	return apiStatusError(op, opOther, status, h, eb, hasBody, red)
}
