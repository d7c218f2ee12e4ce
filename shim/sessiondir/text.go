package sessiondir

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"

	"github.com/agentrunner/runner/wire"
)

// Exit statuses of AttachText for ends that are not a command's exit
// (named in wire, beside the error table, for adapters that run
// runner-shim attach --text).
const (
	TextExitLost  = wire.ShimTextExitLost  // the session was lost: no exit code exists
	TextExitError = wire.ShimTextExitError // the stream ended with an error frame
)

// AttachText is Attach for humans and text-only exec APIs: stdout bytes go
// to stdout, stderr bytes to stderr, and the result is the status a shell
// would report (the exit code, or 128+signal), TextExitLost, or
// TextExitError. The terminal frame's detail goes to stderr when it is not
// an exit. A non-nil error means the attach itself failed (no verdict).
func AttachText(ctx context.Context, dir string, opts AttachOptions, stdout, stderr io.Writer) (int, error) {
	status := -1
	err := Attach(ctx, dir, opts, func(b []byte) error {
		f, err := wire.ParseFrame(b)
		if err != nil {
			return err
		}
		switch f.Kind {
		case wire.FrameData:
			w := stdout
			if f.Stream == wire.StreamStderr {
				w = stderr
			}
			_, err = w.Write(f.Payload)
			return err
		case wire.FrameExit:
			e, err := f.Exit()
			if err != nil {
				return err
			}
			status = e.Code
		case wire.FrameLost:
			fmt.Fprintln(stderr, "runner-shim: session lost: the shim died without an exit record")
			status = TextExitLost
		case wire.FrameError:
			e, err := f.Err()
			if err != nil {
				return err
			}
			fmt.Fprintf(stderr, "runner-shim: %v\n", e)
			status = TextExitError
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	if status < 0 {
		return 0, errors.New("attach ended without a terminal frame")
	}
	return status, nil
}

// Base64 is the text-safe form of a frame stream, for transports that
// mangle bytes (a terminal, a JSON-only exec API): each frame is one line,
// its bytes in standard base64 with padding, ended by "\n". Nothing else
// is on the stream; a line that is not whole was cut.

// Base64Writer returns an emit function for Attach that writes each frame
// to w as one base64 line.
func Base64Writer(w io.Writer) func(frame []byte) error {
	var line []byte
	return func(frame []byte) error {
		line = base64.StdEncoding.AppendEncode(line[:0], frame)
		line = append(line, '\n')
		_, err := w.Write(line)
		return err
	}
}
