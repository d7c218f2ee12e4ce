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
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.filesURL(path), pr)
	if err != nil {
		pr.CloseWithError(err)
		<-done
		return fail(op, 0, invalid("build request: "+e.red().Clean(err.Error())))
	}
	req.Header.Set("Content-Type", mw.FormDataContentType())
	err = e.files(ctx, op, req, nil)
	// Unblock the encoder if the exchange ended before it finished.
	pr.CloseWithError(io.ErrClosedPipe)
	<-done
	return err
}

// ReadFile downloads the file at path (envd's GET /files), at most
// MaxReadFile bytes; a longer file is *adapter.InvalidError.
func (e *Envd) ReadFile(ctx context.Context, path string) ([]byte, error) {
	const op = "envd read file"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.filesURL(path), nil)
	if err != nil {
		return nil, fail(op, 0, invalid("build request: "+e.red().Clean(err.Error())))
	}
	var b []byte
	if err := e.files(ctx, op, req, &b); err != nil {
		return nil, err
	}
	return b, nil
}

func (e *Envd) filesURL(path string) string {
	q := url.Values{"path": {path}}
	if e.user != "" {
		q.Set("username", e.user)
	}
	return e.base + "/files?" + q.Encode()
}

// files sends a files request and maps its answer. envd answers with the
// Error schema of envd.yaml ({code, message}); without it a proxy spoke.
func (e *Envd) files(ctx context.Context, op string, req *http.Request, out *[]byte) error {
	e.headers(req.Header)
	req.Header.Del("Connect-Protocol-Version")
	resp, err := e.hc.Do(req)
	if err != nil {
		return httpcall.TransportError(ctx, provider, op, err, false, e.red())
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, MaxReadFile+1))
	if err != nil {
		return httpcall.TransportError(ctx, provider, op, fmt.Errorf("read body: %w", err), false, e.red())
	}
	if resp.StatusCode == http.StatusOK {
		if out != nil {
			if len(raw) > MaxReadFile {
				return fail(op, resp.StatusCode, invalid(fmt.Sprintf("file exceeds %d bytes", MaxReadFile)))
			}
			*out = raw
		}
		return nil
	}
	var eb apiErrorBody
	hasBody := isContentType(resp.Header, contentTypeUnary) && json.Unmarshal(raw, &eb) == nil && eb.Code != nil && eb.Message != nil
	if hasBody && resp.StatusCode >= 500 {
		// envd itself failed (a full disk is 507): an answer, not an outage.
		msg := e.red().Clean(*eb.Message)
		err := fail(op, resp.StatusCode, providerErr(httpcall.Detail(resp.StatusCode, "", msg)))
		err.Code, err.Message, err.OwnBody = fmt.Sprint(*eb.Code), msg, true
		return err
	}
	return apiStatusError(op, opOther, resp.StatusCode, resp.Header, eb, hasBody, e.red())
}
