package daemon_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/agentrunner/runner/wire"
)

// heapInUse is the Go heap in use after a collection (runnerd runs in
// this process).
func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// TestStdinBounded: 30 concurrent 8 MiB writes to a session whose
// command never reads. Past the session's bound (4 writes, 16 MiB of
// bodies) a write is answered 429 rate_limited with retry_after_ms at
// once; the heap stays near its baseline while the admitted writes wait,
// and returns to it once their callers give up. Before, every call
// blocked and the heap grew by the bodies (100 writes: 33 MB to 1.42 GB) and stayed there.
func TestStdinBounded(t *testing.T) {
	a := startDaemon(t)
	a.createSandbox("box")
	s := a.spawn("box", wire.CreateSession{ID: "deaf", Argv: []string{"sleep", "600"}})
	body := bytes.Repeat([]byte{'x'}, wire.MaxStdinBody) // one backing array for every request
	base := heapInUse()
	const writes = 30 // 240 MiB of bodies: unbounded, all of it held

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	var wg sync.WaitGroup
	limited, abandoned := 0, 0
	for range writes {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, "POST", a.base+"/v1/sandboxes/box/sessions/"+s.ID+"/stdin", bytes.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+a.token)
			resp, err := a.hc.Do(req)
			mu.Lock()
			defer mu.Unlock()
			if errors.Is(err, context.Canceled) {
				abandoned++
				return
			}
			if err != nil {
				t.Errorf("stdin write: %v", err)
				return
			}
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			var eb wire.ErrorBody
			json.Unmarshal(raw, &eb)
			if resp.StatusCode != http.StatusTooManyRequests || eb.Error.Code != wire.CodeRateLimited || eb.Error.RetryAfterMS != 1000 {
				t.Errorf("stdin write past the bound: %d %s, want 429 rate_limited with retry_after_ms 1000", resp.StatusCode, raw)
				return
			}
			limited++
		})
	}
	// The refused writes answer at once; what is admitted waits.
	deadline := time.Now().Add(20 * time.Second)
	for {
		mu.Lock()
		n := limited
		mu.Unlock()
		if n >= writes-4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d writes answered rate_limited within 20 s, want at least %d", n, writes, writes-4)
		}
		time.Sleep(20 * time.Millisecond)
	}
	held := heapInUse()
	if held > base+64<<20 {
		t.Errorf("heap with the admitted writes waiting: %d MiB over a baseline of %d MiB, want at most 64 MiB over (the bound is 16 MiB of bodies)", (held-base)>>20, base>>20)
	}
	cancel() // the callers give up
	wg.Wait()
	if limited+abandoned != writes || abandoned > 4 {
		t.Errorf("%d rate_limited, %d abandoned; want %d in all, at most 4 abandoned", limited, abandoned, writes)
	}
	deadline = time.Now().Add(10 * time.Second)
	for {
		after := heapInUse()
		if after <= base+base/2+16<<20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("heap after the callers gave up: %d MiB, baseline %d MiB: not back near it", after>>20, base>>20)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The abandoned writes left the queue: a new write is admitted
	// (delivered into the pipe's buffer, or waiting behind an abandoned
	// chunk the command never read), never 429.
	wctx, wcancel := context.WithTimeout(context.Background(), time.Second)
	defer wcancel()
	req, _ := http.NewRequestWithContext(wctx, "POST", a.base+"/v1/sandboxes/box/sessions/"+s.ID+"/stdin", bytes.NewReader([]byte("x")))
	req.Header.Set("Authorization", "Bearer "+a.token)
	if resp, err := a.hc.Do(req); err == nil {
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			t.Errorf("a write after every caller gave up: %d %s, want it admitted (204, or waiting)", resp.StatusCode, raw)
		}
	} else if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a write after every caller gave up: %v, want it admitted and waiting", err)
	}
}
