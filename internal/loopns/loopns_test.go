package loopns

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/internal/testcap"
)

// TestNetnsIsolated: a server listening inside the test's namespace is
// reached through its dialer, and not from the host's network (so the
// API server and etcd never listen where anything else on the host can
// reach them).
func TestNetnsIsolated(t *testing.T) {
	if os.Geteuid() != 0 {
		testcap.Skip(t, "root", "a network namespace")
	}
	ns, err := New()
	if err != nil {
		testcap.Skip(t, "netns", err.Error())
	}
	defer ns.Close()
	var ln net.Listener
	if err := ns.Do(func() error {
		var err error
		ln, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // ends when ln is closed
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("inside"))
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := ns.Dial(ctx, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("dial inside the netns: %v", err)
	}
	b, _ := io.ReadAll(c)
	c.Close()
	if string(b) != "inside" {
		t.Fatalf("read %q through the netns dialer, want %q", b, "inside")
	}
	var d net.Dialer
	if c, err := d.DialContext(ctx, "tcp", ln.Addr().String()); !errors.Is(err, syscall.ECONNREFUSED) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("dial %s from the host's netns: %v, want connection refused", ln.Addr(), err)
	}
}
