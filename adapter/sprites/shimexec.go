package sprites

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/guest"
	"github.com/agentrunner/runner/adapter/guest/guestproto"
)

// shimExec is guest.Executor over the exec WebSocket of one sprite
// incarnation.
type shimExec struct {
	a        *Adapter
	name, id string
}

// idempotentCalls are the runner-shim subcommands that may run again when
// their answer was lost: running them twice gives the answer of once.
// spawn is one because adapter/guest always passes --id (a retried spawn
// of the same request answers the first one's session); write and signal
// are not.
var idempotentCalls = map[string]bool{
	"version": true, "spawn": true, "list": true, "status": true,
	"close-stdin": true, "resize": true, "terminate": true,
}

// oneShot returns the subcommand of a runner-shim --json call (adapter/
// guest's argv: shim --root R --json SUB …), or "" for a streamed call
// (attach), whose output goes through as it arrives.
func oneShot(argv []string) string {
	if len(argv) > 4 && argv[3] == "--json" {
		return argv[4]
	}
	return ""
}

// Exec implements guest.Executor. The exit status comes from the exit
// frame when Sprites sends one. When it does not ([ErrNoExit]), the error
// wraps guest.ErrNoStatus and runner-shim's answer, if it arrived, is the
// outcome. A one-shot call whose answer did not arrive — no exit frame,
// or an exit frame with the output lost or cut (sprites-py #16, the
// 64 KiB replay) — is run again when it is idempotent and is otherwise an
// uncertain *adapter.UnavailableError; only its answer line goes on (the
// merged stderr of a replay after it does not). A one-shot call's stdout
// is held until the call ends, so a second run never mixes with the
// first. A spawn gets --hold-task (AdapterConfig.TaskSocket).
func (x *shimExec) Exec(ctx context.Context, argv []string, stdin io.Reader, stdout io.Writer, lifetime time.Duration) (int, error) {
	argv, stdin = dataOffArgv(argv, stdin)
	var in []byte
	if stdin != nil {
		b, err := guest.ReadStdin(stdin, maxCallStdin)
		if err != nil {
			return 0, err
		}
		in = b
	}
	if lifetime > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, lifetime)
		defer cancel()
	}
	call := oneShot(argv)
	if call == "spawn" && x.a.cfg.TaskSocket != "" {
		argv = append(append(argv[:5:5], "--hold-task", x.a.cfg.TaskSocket), argv[5:]...)
	}
	if call == "" {
		// A streamed call (attach, read-only) whose exec delivered not
		// one byte lost its whole output (sprites-py #16; runner-shim's
		// attach always writes a frame): it proved nothing, so it runs
		// again, whether its exit came or not (a missing runner-shim,
		// 127, aside). Once a byte went through, the stream's own decoder
		// judges a cut.
		for attempt := 1; ; attempt++ {
			cw := &counting{w: stdout}
			status, err := x.run(ctx, argv, in, stdin != nil, cw)
			lost := cw.n == 0 && (errors.Is(err, ErrNoExit) || err == nil && status != 127)
			if lost && attempt < maxCallAttempts && ctx.Err() == nil {
				continue
			}
			if errors.Is(err, ErrNoExit) {
				return -1, fmt.Errorf("%w: %w", guest.ErrNoStatus, err)
			}
			if err != nil {
				return status, x.confirm(ctx, err)
			}
			return status, nil
		}
	}
	var ans []byte
	var status int
	var err error
	if call == "list" && len(argv) == 5 {
		ans, status, err = x.list(ctx, argv)
	} else {
		ans, status, err = x.call(ctx, argv, in, stdin != nil, call)
	}
	if ans != nil {
		if _, werr := stdout.Write(ans); werr != nil {
			return -1, werr
		}
	}
	return status, err
}

// call runs one one-shot runner-shim call, again while its answer is
// lost and it is idempotent. It returns the answer to pass on (nil when
// none) and the status and error Exec returns.
func (x *shimExec) call(ctx context.Context, argv []string, in []byte, withStdin bool, call string) ([]byte, int, error) {
	for attempt := 1; ; attempt++ {
		out := &guest.CappedBuffer{Max: maxCallAnswer}
		status, err := x.run(ctx, argv, in, withStdin, out)
		ans := answerOf(out.Bytes())
		noExit := errors.Is(err, ErrNoExit)
		switch {
		case err != nil && !noExit:
			return nil, status, x.confirm(ctx, err)
		case ans != nil:
			// Only up to the answer: stderr merged after it (a replayed
			// fast command) is not runner-shim's answer.
			if err != nil {
				return ans, -1, fmt.Errorf("%w: %w", guest.ErrNoStatus, err)
			}
			return ans, status, nil
		case call == "version" && err == nil && status != 0:
			// runner-shim version answers and exits 0, so any other exit
			// without its answer is no runner-shim at the path, whatever
			// the code and message (how Sprites ends the exec of a missing
			// program is not documented; a shell says 127).
			return nil, missingShim, nil
		case err == nil && status == 127 && out.Len() == 0:
			// No runner-shim at the path (a shell's status): adapter/guest
			// calls it vanished.
			return nil, status, nil
		case err == nil:
			// runner-shim --json always answers, so an exit without an
			// answer lost its output (sprites-py #16, a replay cut at
			// 64 KiB): as unknown as a missing exit frame.
			err = fail("runner-shim "+call, 0, &adapter.UnavailableError{
				Detail: fmt.Sprintf("exit status %d came without runner-shim's answer (%d bytes of output)", status, out.Len()), Uncertain: true}).WithCause(ErrNoExit)
		}
		if !idempotentCalls[call] || attempt == maxCallAttempts || ctx.Err() != nil {
			if call == "version" && noExit && ctx.Err() == nil {
				// Ended every time with no exit frame and without the
				// answer: as the exec of a missing program may
				// (undocumented). adapter/guest installs runner-shim and
				// verifies again (an upload of the same binary, should it
				// have been there, changes nothing); one that still does
				// not answer is a provider error there.
				return nil, missingShim, nil
			}
			return nil, -1, x.confirm(ctx, err)
		}
	}
}

// missingShim is the status adapter/guest reads as "runner-shim is not
// installed" (a shell's 127 with no output): the version call reports it
// for any sign of a missing program, not only that code.
const missingShim = 127

// listPageBytes bounds each page of a paged list: well under the 64 KiB
// Sprites caps a replayed fast exec's output at, with room for merged
// stderr.
const listPageBytes = 32 << 10

// list runs runner-shim list a page at a time (list --max-bytes
// --after) and answers the pages joined as one answer, as one list would:
// a listing of hundreds of sessions is larger than the 64 KiB a replayed
// fast exec keeps, and would be cut on every run. A page that answers an
// error (or anything but a page) is passed on as it came.
func (x *shimExec) list(ctx context.Context, argv []string) ([]byte, int, error) {
	var all []json.RawMessage
	after := ""
	for {
		page := append(argv[:5:5], "--max-bytes", strconv.Itoa(listPageBytes))
		if after != "" {
			page = append(page, "--after", after)
		}
		ans, status, err := x.call(ctx, page, nil, false, "list")
		if ans == nil {
			return nil, status, err
		}
		line := bytes.TrimSpace(ans)
		if i := bytes.LastIndexByte(line, '\n'); i >= 0 {
			line = line[i+1:]
		}
		// The sessions pass on as they came (json.RawMessage).
		var a guestproto.Answer[json.RawMessage]
		if json.Unmarshal(line, &a) != nil || a.Error != nil || a.Sessions == nil {
			return ans, status, err
		}
		sessions := a.Sessions
		all = append(all, sessions...)
		var last struct {
			ID string `json:"id"`
		}
		if a.More {
			if len(sessions) == 0 || json.Unmarshal(sessions[len(sessions)-1], &last) != nil || last.ID == "" || last.ID == after {
				// Never a short listing that looks whole.
				return nil, -1, &adapter.ProviderError{Provider: provider, Detail: "runner-shim list: a page with more to come and no session to continue after"}
			}
			after = last.ID
			continue
		}
		if all == nil {
			all = []json.RawMessage{}
		}
		a.Sessions, a.More = all, false
		b, _ := json.Marshal(a)
		return append(b, '\n'), status, err
	}
}

// dataOffArgv moves the bytes of a `write --base64 ID B64` from argv to
// stdin (one base64 line, which runner-shim reads the same way): an exec's
// argv travels in the WebSocket URL's query, where stdin bytes (a secret
// piped to an agent) must never go and where 64 KiB of base64 would
// overflow URL limits of the proxies on the way.
func dataOffArgv(argv []string, stdin io.Reader) ([]string, io.Reader) {
	if stdin != nil || oneShot(argv) != "write" || len(argv) != 8 || argv[5] != "--base64" {
		return argv, stdin
	}
	return argv[:7:7], strings.NewReader(argv[7] + "\n")
}

// answerOf returns b up to the end of its last line that is one whole
// JSON object (runner-shim's one-line answer, printed only once the call
// took effect), or nil when no line is. What follows that line is not
// stdout's: a replayed fast command has its stderr merged in after it.
func answerOf(b []byte) []byte {
	end := len(b)
	for end > 0 {
		start := bytes.LastIndexByte(b[:end], '\n') + 1
		line := bytes.TrimSpace(b[start:end])
		if len(line) > 0 && line[0] == '{' && json.Valid(line) {
			return b[:end]
		}
		end = max(start-1, 0)
	}
	return nil
}

// run is one exec: stdin (when given) written beside the reader and then
// closed, stdout copied as it arrives, stderr dropped.
func (x *shimExec) run(ctx context.Context, argv []string, in []byte, withStdin bool, stdout io.Writer) (int, error) {
	s, err := x.a.cfg.Client.Exec(ctx, x.name, ExecOptions{Argv: argv, Stdin: withStdin, MaxRunAfterDisconnect: disconnectGrace})
	if err != nil {
		return 0, err
	}
	// The writer's owner is this call: Close unblocks it, Wait collects it.
	var wg sync.WaitGroup
	defer wg.Wait()
	defer s.Close()
	if withStdin {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if s.WriteStdin(ctx, in) == nil {
				_ = s.CloseStdin(ctx)
			}
		}()
	}
	for {
		ev, err := s.Recv(ctx)
		if err != nil {
			return -1, err
		}
		switch ev.Kind {
		case EventStdout:
			if _, err := stdout.Write(ev.Data); err != nil {
				// The reader (an attach's consumer) went away.
				return -1, fmt.Errorf("copy stdout: %w", context.Canceled)
			}
		case EventExit:
			return ev.ExitCode, nil
		}
	}
}

// confirm judges a failed call: one that proves nothing is followed by a
// GET of the sprite, whose 404 (or another incarnation under the name)
// makes it not_found. Anything else stays what it was.
func (x *shimExec) confirm(ctx context.Context, err error) error {
	if ctx.Err() != nil || !(errors.Is(err, adapter.ErrUnavailable) || errors.Is(err, adapter.ErrProvider)) {
		return err
	}
	sp, gerr := x.a.cfg.Client.Get(ctx, x.name)
	switch {
	case errors.Is(gerr, adapter.ErrNotFound):
		x.a.forget(x.id)
		return fmt.Errorf("sprite %s: %w", x.name, adapter.ErrNotFound)
	case gerr == nil && sp.ID != x.id:
		x.a.forget(x.id)
		return fmt.Errorf("sprite %s is now %s, not %s: %w", x.name, sp.ID, x.id, adapter.ErrNotFound)
	}
	return err
}

// install uploads runner-shim to the configured path with fs/write, mode
// 0755, parents created (guest.Config.Install, and Create of a new
// sprite).
func (x *shimExec) install(ctx context.Context) error {
	b, err := x.a.cfg.ShimBinary()
	if err != nil {
		return &adapter.ProviderError{Provider: provider, Detail: "read the runner-shim binary: " + err.Error()}
	}
	if _, err := x.a.cfg.Client.WriteFile(ctx, x.name, x.a.cfg.Shim, b, 0o755); err != nil {
		return x.confirm(ctx, err)
	}
	return nil
}

// counting counts what goes through to w.
type counting struct {
	w io.Writer
	n int64
}

func (c *counting) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
