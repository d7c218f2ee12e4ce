package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime/pprof"
	"time"

	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/daemon"
)

// profile runs the throughput figures once more with the daemon in this
// process (daemon.Run, the same code runnerd runs) so one CPU profile
// covers daemon and client, and with bench/internal/profshim as the shim
// command so the shim writes its own. Files in cfg.ProfileDir:
//
//	live.pprof     daemon+client, one client on a live StreamBytes stream
//	replay.pprof   daemon+client, attach replay of the finished stream
//	shim-PID.pprof the shim of that session (its whole life)
func profile(ctx context.Context, h *harness) error {
	dir, err := filepath.Abs(h.cfg.ProfileDir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// The shim inherits the daemon's environment: this process's.
	os.Setenv("RUNNERBENCH_SHIM_PROFILE", dir)
	defer os.Unsetenv("RUNNERBENCH_SHIM_PROFILE")

	d, err := startInProcess(ctx, filepath.Join(h.dir, "pstate"), []string{h.bins.profshim})
	if err != nil {
		return err
	}
	defer d.stop()
	p := &harness{cfg: h.cfg, dir: h.dir, bins: h.bins, rep: &Report{}, d: d}
	sb, err := p.newSandbox(ctx, "profile")
	if err != nil {
		return err
	}
	defer p.dropSandbox(ctx, sb)
	mib := float64(h.cfg.StreamBytes) / (1 << 20)

	var id string
	if err := cpuProfile(filepath.Join(dir, "live.pprof"), func() error {
		var d time.Duration
		var err error
		id, d, _, err = p.liveStream(ctx, sb, 1, false, false)
		h.logf("profiled live stream: %.0f MiB/s", mib/d.Seconds())
		return err
	}); err != nil {
		return err
	}
	return cpuProfile(filepath.Join(dir, "replay.pprof"), func() error {
		d, err := p.replay(ctx, sb, id)
		h.logf("profiled replay: %.0f MiB/s", mib/d.Seconds())
		return err
	})
}

func cpuProfile(path string, f func() error) error {
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	defer out.Close()
	if err := pprof.StartCPUProfile(out); err != nil {
		return err
	}
	err = f()
	pprof.StopCPUProfile()
	return err
}

// startInProcess runs daemon.Run in this process on a loopback listener
// with shimCmd as the shim command, so profiles and -benchmem see the
// daemon's work. Its pid is this process's.
func startInProcess(ctx context.Context, state string, shimCmd []string) (*daemonProc, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	token := randomToken()
	// Its own root, as startDaemon's: a fixed name would be shared with a
	// concurrent run's in-process daemon (see startDaemon).
	root := "runner-profile-" + randomToken()[:12]
	dctx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	ready := make(chan struct{})
	go func() {
		ran <- daemon.Run(dctx, daemon.Config{
			StateDir:    state,
			Socket:      "none",
			TCPListener: l,
			Token:       token,
			ShimCommand: shimCmd,
			NetPolicy:   daemon.NetPolicyOff, // never touch the real host's network
			// Not the process runnerd's root: two runnerds in one cgroup
			// must not share one (runnerd refuses to start; daemon/claim.go).
			CgroupRoot: root,
			Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
			Ready:      func(string) { close(ready) },
		})
	}()
	select {
	case <-ready:
	case err := <-ran:
		stop()
		return nil, fmt.Errorf("in-process daemon: %w", err)
	case <-time.After(20 * time.Second):
		stop()
		<-ran
		return nil, fmt.Errorf("in-process daemon did not start")
	}
	c, err := client.New("http://"+l.Addr().String(), token, client.Options{})
	if err != nil {
		stop()
		<-ran
		return nil, err
	}
	return &daemonProc{state: state, pid: os.Getpid(), url: "http://" + l.Addr().String(), token: token, c: c,
		stop: func() { c.Close(); stop(); <-ran; removeCgroupRoot(root) }}, nil
}
