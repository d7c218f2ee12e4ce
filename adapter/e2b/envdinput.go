package e2b

// StreamInput: one client-streaming call that carries a process's stdin
// in order, and the InputStream that writes to it.

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"sync"

	"github.com/agentrunner/runner/adapter/hosted/httpcall"
)

// StreamInput opens a client stream of stdin writes to one process (rpc
// StreamInput): writes arrive in order. It owns one goroutine, the HTTP
// exchange, which Close stops and waits for.
func (e *Envd) StreamInput(ctx context.Context, sel Selector) (*InputStream, error) {
	ws, err := sel.wire()
	if err != nil {
		return nil, fail("envd stream input", 0, err)
	}
	first, err := json.Marshal(map[string]any{"start": map[string]any{"process": ws}})
	if err != nil {
		return nil, fail("envd stream input", 0, invalid(err.Error()))
	}
	pr, pw := io.Pipe()
	sctx, cancel := context.WithCancel(ctx)
	req, err := http.NewRequestWithContext(sctx, http.MethodPost, e.base+"/process.Process/StreamInput", pr)
	if err != nil {
		cancel()
		return nil, fail("envd stream input", 0, invalid("build request: "+e.red().Clean(err.Error())))
	}
	e.headers(req.Header)
	req.Header.Set("Content-Type", contentTypeStream)
	in := &InputStream{ctx: ctx, cancel: cancel, pw: pw, done: make(chan struct{}), red: e.red()}
	go in.exchange(e, req)
	if err := in.send(first); err != nil {
		in.Close()
		return nil, err
	}
	return in, nil
}

// InputStream is an open StreamInput call. Write and Close may not be
// called concurrently with each other; Close is idempotent and returns the
// call's result.
type InputStream struct {
	ctx    context.Context
	cancel context.CancelFunc
	pw     *io.PipeWriter
	red    httpcall.Redactor
	done   chan struct{}
	err    error // set before done closes

	closeOnce sync.Once
	closeErr  error
}

const opStreamInput = "envd stream input"

func (in *InputStream) exchange(e *Envd, req *http.Request) {
	defer close(in.done)
	resp, err := e.hc.Do(req)
	if err != nil {
		in.err = httpcall.TransportError(in.ctx, provider, opStreamInput, err, false, in.red)
		in.unblock(in.err)
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, MaxMessageSize))
		in.err = httpError(opStreamInput, resp.StatusCode, resp.Header, raw, in.red)
		in.unblock(in.err)
		return
	}
	// The answer is one StreamInputResponse and the end-stream message.
	for {
		flags, msg, err := readEnvelope(resp.Body)
		if err != nil {
			if err == io.EOF {
				err = errors.New("stream ended without an end-stream message")
			}
			in.err = httpcall.TransportError(in.ctx, provider, opStreamInput, err, false, in.red)
			in.unblock(in.err)
			return
		}
		if flags&flagEndStream == 0 {
			continue
		}
		es, perr := parseEndStream(msg)
		switch {
		case perr != nil:
			in.err = fail(opStreamInput, 0, providerErr(perr.Error()))
		case es.Error != nil:
			in.err = connectError(opStreamInput, 0, nil, es.Error.Code, es.Error.Message, true, in.red)
		}
		in.unblock(in.err)
		return
	}
}

// pr unblocks a Write waiting on the pipe once the exchange ended.
func (in *InputStream) unblock(err error) {
	if err == nil {
		err = io.ErrClosedPipe
	}
	in.pw.CloseWithError(err)
}

func (in *InputStream) send(msg []byte) error {
	if err := writeEnvelope(in.pw, 0, msg); err != nil {
		select {
		case <-in.done:
			if in.err != nil {
				return in.err
			}
		default:
		}
		return httpcall.TransportError(in.ctx, provider, opStreamInput, err, false, in.red)
	}
	return nil
}

// Write sends data to the process's stdin (or terminal when pty).
func (in *InputStream) Write(data []byte, pty bool) error {
	b, err := json.Marshal(map[string]any{"data": map[string]any{"input": inputMsg(data, pty)}})
	if err != nil {
		return fail(opStreamInput, 0, invalid(err.Error()))
	}
	return in.send(b)
}

// Close ends the request stream and waits for envd's answer. It does not
// close the process's stdin (that is CloseStdin).
func (in *InputStream) Close() error {
	in.closeOnce.Do(func() {
		in.pw.Close()
		<-in.done
		in.cancel()
		in.closeErr = in.err
	})
	return in.closeErr
}
