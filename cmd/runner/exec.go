package main

// runner exec: run a command to completion, rejoining the session when the
// connection to runnerd is lost, and print its output or its --json shape.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/wire"
)

// newID returns a session id for exec, so that runner can name the session
// if the answer never arrives.
func newID(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// execJSON is what exec --json prints. stdout and stderr are raw bytes,
// so they are base64 (standard encoding, with padding), and the field
// names say so; the flags are always present.
type execJSON struct {
	Session         string    `json:"session"`
	StdoutBase64    []byte    `json:"stdout_base64"`
	StderrBase64    []byte    `json:"stderr_base64"`
	StdoutTruncated bool      `json:"stdout_truncated"`
	StderrTruncated bool      `json:"stderr_truncated"`
	TimedOut        bool      `json:"timed_out"`
	Exit            wire.Exit `json:"exit"`
}

func execJSONOf(r wire.ExecResult) execJSON {
	return execJSON{Session: r.Session, StdoutBase64: nonNil(r.Stdout), StderrBase64: nonNil(r.Stderr),
		StdoutTruncated: r.StdoutTruncated, StderrTruncated: r.StderrTruncated, TimedOut: r.TimedOut, Exit: r.Exit}
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// execRejoin runs req and, when the connection to runnerd is lost before
// the answer (runnerd restarted, or the connection was cut), sends it
// again with the same session id for up to reconnectFor: runnerd then
// rejoins the running session (a retried id never starts a second
// process, and stdin is not sent twice) and answers its whole output and
// exit once it ends, so every byte is printed once. A --max-time keeps
// its original deadline.
func execRejoin(ctx context.Context, e *env, c *client.Client, name string, req wire.Exec) (wire.ExecResult, error) {
	start := time.Now()
	timeout := time.Duration(req.TimeoutMS) * time.Millisecond
	var lostAt time.Time
	backoff := 250 * time.Millisecond
	for {
		if timeout > 0 {
			req.TimeoutMS = int(max((timeout-time.Since(start))/time.Millisecond, 1))
		}
		r, err := c.Exec(ctx, name, req)
		if err == nil || ctx.Err() != nil || !errors.Is(err, adapter.ErrUnavailable) {
			return r, err
		}
		if lostAt.IsZero() {
			lostAt = time.Now()
			msg := fmt.Sprintf("connection to runnerd lost; rejoining session %s (the command keeps running)...", req.ID)
			if e.g.json {
				writeJSONWarning(e, msg)
			} else {
				fmt.Fprintf(e.io.err, "runner: %s\n", msg)
			}
		} else if time.Since(lostAt) > reconnectFor {
			return r, err
		}
		select {
		case <-ctx.Done():
			return r, err
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 2*time.Second)
	}
}

func execCmd(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
	var envs stringList
	fs.Var(&envs, "env", "set KEY=VALUE in the command's environment (repeatable)")
	cwd := fs.String("cwd", "", "working directory, relative to the workspace")
	id := fs.String("id", "", "session id (default: exec-<random>); a retry with the same id never runs twice")
	stdin := fs.Bool("i", false, "send runner's own stdin (read to EOF) as the command's stdin")
	maxTime := fs.Duration("max-time", 0, "terminate the command after this long (0: no limit)")
	return func(ctx context.Context, e *env, pos, argv []string) error {
		name := pos[0]
		c, err := e.client()
		if err != nil {
			return err
		}
		req := wire.Exec{ID: *id, Argv: argv, Env: envs, Cwd: *cwd}
		if req.ID == "" {
			req.ID = newID("exec-")
		}
		if *maxTime > 0 {
			req.TimeoutMS = int(max(*maxTime/time.Millisecond, 1))
		}
		if *stdin {
			b, err := io.ReadAll(io.LimitReader(e.io.in, wire.MaxStdinBody+1))
			if err != nil {
				return &exitError{code: exitUsage, kind: "usage", msg: fmt.Sprintf("runner: exec: read stdin: %v", err)}
			}
			if len(b) > wire.MaxStdinBody {
				return usagef("exec", "-i: stdin is larger than %d bytes; use spawn and write instead", wire.MaxStdinBody)
			}
			req.Stdin = b
			// runnerd reads an exec request as one JSON body of at most
			// wire.MaxJSONBody bytes, stdin in base64 (about 768 KiB of
			// it): refuse here, as the usage mistake it is, rather than
			// send a request runnerd must refuse.
			if body, err := json.Marshal(req); err == nil && len(body) > wire.MaxJSONBody {
				return usagef("exec", "-i: %d bytes of stdin do not fit in one exec request (%d bytes of JSON, stdin in base64: about %d KiB of stdin at most); use spawn and write instead",
					len(b), wire.MaxJSONBody, wire.MaxJSONBody*3/4>>10)
			}
		}
		what := "exec " + name
		sigs := make(chan os.Signal, 2)
		signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
		defer signal.Stop(sigs)

		// Ask runnerd once before the exec: rejoining after a cut
		// connection is only for a daemon that was there (a runnerd that
		// never answered is reported at once, not waited for).
		hctx, hcancel := e.callCtx(ctx)
		_, herr := c.Health(hctx)
		hcancel()
		if herr != nil {
			ce := &cliError{what: what, err: herr}
			if _, kind := codeOf(herr); kind == "unavailable" {
				ce.hint = hintFor(kind, e.where)
			}
			return ce
		}

		ectx, cancel := context.WithCancel(ctx)
		defer cancel()
		type result struct {
			r   wire.ExecResult
			err error
		}
		done := make(chan result, 1)
		go func() {
			r, err := execRejoin(ectx, e, c, name, req)
			done <- result{r, err}
		}()
		interrupts := 0
		var res result
	wait:
		for {
			select {
			case res = <-done:
				break wait
			case s := <-sigs:
				interrupts++
				if interrupts > 1 {
					cancel()
					<-done
					return &exitError{code: exitInterrupted, kind: "interrupted", what: what, msg: fmt.Sprintf(
						"runner: %s: stopped waiting; the command may still run\nrunner: hint: runner logs %s %s -f   |   runner terminate %s %s",
						what, name, req.ID, name, req.ID)}
				}
				sig := "INT"
				if s == syscall.SIGTERM {
					sig = "TERM"
				}
				sctx, scancel := e.callCtx(ctx)
				err := c.Signal(sctx, name, req.ID, sig)
				scancel()
				if err != nil {
					fmt.Fprintf(e.io.err, "runner: %s: could not forward SIG%s: %s\n", what, sig, oneLine(detailOf(err)))
				}
				fmt.Fprintf(e.io.err, "runner: sent SIG%s to %s; Ctrl-C again to stop waiting (the command keeps running)\n", sig, req.ID)
			}
		}
		if res.err != nil {
			if xe := startFailure(res.err, what, name, argv[0]); xe != nil {
				return xe
			}
			ce := &cliError{what: what, err: res.err}
			switch _, kind := codeOf(res.err); kind {
			case "unavailable":
				ce.hint = hintFor(kind, e.where) + "\n" + fmt.Sprintf(
					"if runnerd got the request, the outcome is unknown and the command may still run as session %s: runner sessions %s %s", req.ID, name, req.ID)
			case "not_found":
				ce.hint = noSandboxHint
			}
			return ce
		}
		r := res.r
		if e.g.json {
			if err := e.printJSON(execJSONOf(r)); err != nil {
				return err
			}
		} else {
			if _, err := e.io.out.Write(r.Stdout); err != nil {
				return err
			}
			if _, err := e.io.err.Write(r.Stderr); err != nil {
				return err
			}
		}
		// In --json mode the object says all this (stdout_truncated,
		// stderr_truncated, timed_out, exit) and stderr stays JSON-only.
		for _, t := range []struct {
			trunc  bool
			stream string
		}{{r.StdoutTruncated, "stdout"}, {r.StderrTruncated, "stderr"}} {
			if t.trunc && !e.g.json {
				fmt.Fprintf(e.io.err, "runner: %s: %s was cut at %d MiB; the rest: runner logs %s %s --stream %s --cursor %d\n",
					what, t.stream, wire.MaxExecOutput>>20, name, r.Session, t.stream, wire.MaxExecOutput)
			}
		}
		if r.TimedOut && !e.g.json {
			fmt.Fprintf(e.io.err, "runner: %s: terminated after --max-time %s\n", what, *maxTime)
		}
		return exitErrorOf(what, r.Exit)
	}
}
