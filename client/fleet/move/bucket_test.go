package move_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/client/fleet/move"
	"github.com/agentrunner/runner/internal/s3test"
)

// TestCredentialsNeverPrint: a Config (and its Credentials) formatted with
// every verb, logged with slog, and the errors of a refused credential
// and of a bad credentials file carry neither the secret nor the key id.
func TestCredentialsNeverPrint(t *testing.T) {
	const id, secret = "AKIDNEVERPRINTED0001", "s3cr3t/never+printed/0123456789abcdefghij"
	cfg := move.Config{Endpoint: "127.0.0.1:1", Bucket: "b", Credentials: move.Credentials{AccessKeyID: id, SecretAccessKey: secret, SessionToken: "tok-never-printed"}}
	var logged bytes.Buffer
	slog.New(slog.NewTextHandler(&logged, nil)).Info("config", "cfg", cfg, "creds", cfg.Credentials)
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("config", "cfg", cfg, "creds", cfg.Credentials)
	for _, s := range []string{
		fmt.Sprintf("%v", cfg), fmt.Sprintf("%+v", cfg), fmt.Sprintf("%#v", cfg), fmt.Sprintf("%s", cfg.Credentials),
		fmt.Sprintf("%v", &cfg), fmt.Sprintf("%+v", &cfg), fmt.Sprintf("%q", cfg.Credentials), fmt.Sprintf("%x", cfg.Credentials),
		logged.String(),
	} {
		for _, leak := range []string{id, secret, "tok-never-printed", fmt.Sprintf("%x", secret)} {
			if strings.Contains(s, leak) {
				t.Fatalf("formatted config leaks %q: %s", leak, s)
			}
		}
	}

	// A file readable by others is refused, and no error quotes a line.
	dir := t.TempDir()
	f := filepath.Join(dir, "s3.env")
	body := "# the fleet's bucket\nAWS_ACCESS_KEY_ID=" + id + "\nexport AWS_SECRET_ACCESS_KEY=" + secret + "\n"
	if err := os.WriteFile(f, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := move.CredentialsFromFile(f); err == nil || strings.Contains(err.Error(), secret) {
		t.Fatalf("CredentialsFromFile of a 0644 file: got %v, want a refusal without the secret", err)
	}
	if err := os.Chmod(f, 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := move.CredentialsFromFile(f)
	if err != nil || c.AccessKeyID != id || c.SecretAccessKey != secret {
		t.Fatalf("CredentialsFromFile: got %v, %v", c, err)
	}
	if err := os.WriteFile(f, []byte("AWS_SECRET_ACCESS_KEY "+secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := move.CredentialsFromFile(f); err == nil || strings.Contains(err.Error(), secret) {
		t.Fatalf("CredentialsFromFile of a malformed line: got %v, want a refusal without the secret", err)
	}
	t.Setenv(move.EnvAccessKeyID, id)
	t.Setenv(move.EnvSecretAccessKey, "")
	if _, err := move.CredentialsFromEnv(); !errors.Is(err, move.ErrNoCredentials) {
		t.Fatalf("CredentialsFromEnv without a secret: got %v, want ErrNoCredentials", err)
	}

	// A real server refusing a wrong secret: denied, and the error names
	// neither the key id's secret nor the secret sent.
	srv := s3test.Start(t)
	tr := srv.Transport()
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bad := move.Config{Endpoint: srv.Endpoint, Bucket: srv.Bucket, Transport: tr,
		Credentials: move.Credentials{AccessKeyID: srv.AccessKeyID, SecretAccessKey: secret}}
	_, err = move.Open(ctx, bad)
	if !errors.Is(err, adapter.ErrDenied) {
		t.Fatalf("Open with a wrong secret: got %v, want denied", err)
	}
	if s := fmt.Sprintf("%v %+v", err, err); strings.Contains(s, secret) || strings.Contains(s, srv.SecretAccessKey) {
		t.Fatalf("Open's error leaks a secret: %s", s)
	}
	bad.Credentials = move.Credentials{AccessKeyID: "AKIDUNKNOWN000000001", SecretAccessKey: secret}
	if _, err := move.Open(ctx, bad); !errors.Is(err, adapter.ErrDenied) || strings.Contains(err.Error(), secret) {
		t.Fatalf("Open with an unknown key: got %v, want denied without the secret", err)
	}
	good := bad
	good.Credentials = move.Credentials{AccessKeyID: srv.AccessKeyID, SecretAccessKey: srv.SecretAccessKey}
	good.Bucket = "no-such-bucket"
	if _, err := move.Open(ctx, good); !errors.Is(err, adapter.ErrInvalid) {
		t.Fatalf("Open of a missing bucket: got %v, want invalid", err)
	}
}

// TestLeaseOneMover: of eight movers taking the same sandbox's lease at
// once on a real S3 server, exactly one holds it and the others get
// *LeaseHeldError naming the holder; once released the next one takes
// it; an expired lease is taken over, and its old holder's release is
// refused (ErrLeaseLost) without removing the new holder's lease.
func TestLeaseOneMover(t *testing.T) {
	srv := s3test.Start(t)
	st, _ := openStore(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const n = 8
	var wg sync.WaitGroup
	leases := make([]move.Lease, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			leases[i], errs[i] = st.Acquire(ctx, move.Lease{Sandbox: "ra-box", Holder: fmt.Sprintf("mover-%d", i), From: "ra", To: "rb"}, time.Hour)
		})
	}
	wg.Wait()
	winner := -1
	for i, err := range errs {
		var held *move.LeaseHeldError
		switch {
		case err == nil && winner >= 0:
			t.Fatalf("movers %d and %d both hold the lease", winner, i)
		case err == nil:
			winner = i
		case !errors.As(err, &held) || !errors.Is(err, move.ErrLeaseHeld) || !errors.Is(err, adapter.ErrInvalid):
			t.Fatalf("mover %d: got %v, want *LeaseHeldError", i, err)
		}
	}
	if winner < 0 {
		t.Fatalf("no mover holds the lease: %v", errs)
	}
	for i, err := range errs {
		var held *move.LeaseHeldError
		if i != winner && errors.As(err, &held) && held.Held.Holder != leases[winner].Holder {
			t.Fatalf("mover %d was told %s holds it; %s does", i, held.Held.Holder, leases[winner].Holder)
		}
	}
	if err := st.Release(ctx, leases[winner]); err != nil {
		t.Fatal(err)
	}
	next, err := st.Acquire(ctx, move.Lease{Sandbox: "ra-box", Holder: "next"}, time.Hour)
	if err != nil {
		t.Fatalf("Acquire after release: %v", err)
	}
	if err := st.Release(ctx, next); err != nil {
		t.Fatal(err)
	}

	// An expired lease (its mover died) is taken over; the dead mover's
	// release then refuses and leaves the new lease in place.
	old, err := st.Acquire(ctx, move.Lease{Sandbox: "ra-exp", Holder: "dead"}, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	newer, err := st.Acquire(ctx, move.Lease{Sandbox: "ra-exp", Holder: "alive"}, time.Hour)
	if err != nil {
		t.Fatalf("take over an expired lease: %v", err)
	}
	if err := st.Release(ctx, old); !errors.Is(err, move.ErrLeaseLost) {
		t.Fatalf("release of a lease taken over: got %v, want ErrLeaseLost", err)
	}
	var held *move.LeaseHeldError
	if _, err := st.Acquire(ctx, move.Lease{Sandbox: "ra-exp", Holder: "third"}, time.Hour); !errors.As(err, &held) || held.Held.Holder != "alive" {
		t.Fatalf("Acquire while alive holds it: got %v, want held by alive", err)
	}
	if err := st.Release(ctx, newer); err != nil {
		t.Fatal(err)
	}

	// Eight movers find the same lease expired at once: the takeover is
	// conditional on its ETag (If-Match), so exactly one wins.
	if _, err := st.Acquire(ctx, move.Lease{Sandbox: "ra-race", Holder: "dead"}, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	for i := range n {
		wg.Go(func() {
			leases[i], errs[i] = st.Acquire(ctx, move.Lease{Sandbox: "ra-race", Holder: fmt.Sprintf("taker-%d", i)}, time.Hour)
		})
	}
	wg.Wait()
	won := 0
	for i, err := range errs {
		var held *move.LeaseHeldError
		switch {
		case err == nil:
			won++
		case !errors.As(err, &held):
			t.Fatalf("taker %d: got %v, want *LeaseHeldError", i, err)
		}
	}
	if won != 1 {
		t.Fatalf("%d movers took over the expired lease, want 1 (errors %v)", won, errs)
	}
}
