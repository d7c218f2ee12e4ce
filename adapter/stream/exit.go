package stream

import (
	"fmt"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/wire"
)

// Exit maps a wire exit record of session id into the contract: exited
// keeps its code; a signal death is Code -1 with the signal's name; a
// record that says terminated (the command ended after a terminate,
// suspend or destroy asked it to stop; the record keeps that, so it
// survives restarts of both sides) is adapter.ReasonTerminated with the
// same Code and Signal; lost is adapter.ErrLost, never an exit. An exit
// code outside 0-255 or an unknown reason is a *adapter.ProviderError
// naming provider.
func Exit(provider, id string, e wire.Exit) (adapter.Exit, error) {
	var ex adapter.Exit
	switch e.Reason {
	case wire.ExitExited:
		ex = adapter.Exit{Code: e.Code, Reason: adapter.ReasonExited}
		if e.Code < 0 || e.Code > 255 {
			return ex, &adapter.ProviderError{Provider: provider, Detail: fmt.Sprintf("exit code %d out of range", e.Code)}
		}
	case wire.ExitSignaled:
		ex = adapter.Exit{Code: -1, Signal: wire.SignalString(e.Signal), Reason: adapter.ReasonSignaled}
	case wire.ExitLost:
		d := "session " + id
		if e.Detail != "" {
			d += ": " + e.Detail
		}
		return ex, fmt.Errorf("%s: %w", d, adapter.ErrLost)
	default:
		return ex, &adapter.ProviderError{Provider: provider, Detail: fmt.Sprintf("unknown exit reason %q", e.Reason)}
	}
	if e.Terminated {
		ex.Reason = adapter.ReasonTerminated
	}
	return ex, nil
}

// Frame converts one wire frame of session id into the contract's frame.
// ok is false for a frame that carries nothing for the consumer (a
// heartbeat, a kind this version does not know). A lost frame is
// adapter.ErrLost whatever its payload says; an exit or error frame whose
// payload does not decode is unavailable (the bytes were damaged, the
// session's end is not known from them).
func Frame(provider, id string, f wire.Frame) (out adapter.Frame, ok bool) {
	switch f.Kind {
	case wire.FrameData:
		name := adapter.StreamName(f.Stream.StreamName())
		return adapter.Frame{Stream: name, Offset: f.Offset, Data: f.Payload}, true
	case wire.FrameExit, wire.FrameLost:
		e, derr := f.Exit()
		if f.Kind == wire.FrameLost {
			// Lost whatever its payload says: Exit reports adapter.ErrLost
			// (with the detail, if it decoded).
			e.Reason = wire.ExitLost
		} else if derr != nil {
			out.Err = &adapter.UnavailableError{Detail: fmt.Sprintf("session %s: decode exit frame: %v", id, derr)}
			return out, true
		}
		ex, xerr := Exit(provider, id, e)
		if xerr != nil {
			out.Err = xerr
		} else {
			out.Exit = &ex
		}
		return out, true
	case wire.FrameError:
		we, derr := f.Err()
		if derr != nil {
			out.Err = &adapter.UnavailableError{Detail: fmt.Sprintf("session %s: decode error frame: %v", id, derr)}
		} else {
			out.Err = FrameError(provider, "session "+id, we)
		}
		return out, true
	}
	return out, false
}
