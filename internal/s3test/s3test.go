// Package s3test runs a real S3-compatible server for tests: SeaweedFS
// (its weed command, "weed mini": master, volume, filer and S3 gateway in
// one process) built from Go modules and cached (build.go), started in a
// network namespace of the test's own whose only interface is loopback
// (so its default ports never meet another test's, and nothing it does
// leaves the host: its telemetry is off and has no route anyway), with
// its data in t.TempDir(), one bucket made at start, and stopped by pid.
// Clients reach it through Transport, which dials inside the namespace.
//
// Tests that need it call Start; without root (the namespace) or, on a
// cold cache, without the module proxy, Start skips through
// internal/testcap, which fails under CI=true.
package s3test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/internal/loopns"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/agentrunner/runner/internal/testcap"
)

// Endpoint is the S3 gateway's address inside the server's namespace.
const Endpoint = "127.0.0.1:8333"

// Bucket is the bucket Start makes.
const Bucket = "runner-test"

// Server is one running SeaweedFS. Its fields are fixed at Start.
type Server struct {
	// Endpoint and Bucket name where to reach it (through Transport).
	Endpoint, Bucket string
	// AccessKeyID and SecretAccessKey are the one identity it accepts
	// (admin of its buckets), random per server.
	AccessKeyID, SecretAccessKey string

	t    testing.TB
	dir  string
	ns   *loopns.NS
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{}
}

// Start builds (or finds cached) weed, starts it and waits until its S3
// gateway answers and the bucket exists. Cleanup stops it.
func Start(t testing.TB) *Server {
	t.Helper()
	if os.Geteuid() != 0 {
		testcap.Skip(t, "root", "a network namespace for the S3 server")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	bin, err := Build(ctx, testLog{t})
	if errors.Is(err, ErrNoModules) {
		testcap.Skip(t, "seaweedfs", fmt.Sprintf("build a real S3 server from Go modules: %v", err))
	}
	if err != nil {
		t.Fatalf("build SeaweedFS: %v", err)
	}
	ns, err := loopns.New()
	if err != nil {
		testcap.Skip(t, "netns", err.Error())
	}
	s := &Server{Endpoint: Endpoint, Bucket: Bucket, AccessKeyID: "RUNNER" + randHex(t, 7), SecretAccessKey: randHex(t, 20),
		t: t, dir: t.TempDir(), ns: ns, done: make(chan struct{})}
	t.Cleanup(s.stop)
	cfg := map[string]any{"identities": []any{map[string]any{
		"name":        "runner",
		"credentials": []any{map[string]string{"accessKey": s.AccessKeyID, "secretKey": s.SecretAccessKey}},
		"actions":     []string{"Admin", "Read", "List", "Tagging", "Write"},
	}}}
	b, _ := json.Marshal(cfg)
	conf := filepath.Join(s.dir, "s3.json")
	if err := os.WriteFile(conf, b, 0o600); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(s.dir, "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	s.log, err = os.OpenFile(filepath.Join(s.dir, "weed.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	s.cmd = exec.Command(bin, "mini",
		"-dir="+data, "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
		"-s3.config="+conf, "-bucket="+Bucket,
		"-master.telemetry=false", "-webdav=false", "-admin.ui=false",
		"-s3.port.iceberg=0", "-s3.port.lance=0",
		// Its unix sockets go in the test's directory, not /tmp where
		// another test's server would meet them.
		"-filer.localSocket="+filepath.Join(s.dir, "filer.sock"),
		"-s3.localSocket="+filepath.Join(s.dir, "s3.sock"),
	)
	s.cmd.Dir = s.dir
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := ns.Start(s.cmd); err != nil {
		t.Fatalf("start weed: %v", err)
	}
	go func() { _ = s.cmd.Wait(); close(s.done) }() // ends when weed does
	s.waitBucket(ctx, 2*time.Minute)
	return s
}

// Transport dials the server inside its namespace; give it to the S3
// client. Each call returns a new transport (close its idle connections
// when done).
func (s *Server) Transport() *http.Transport {
	return &http.Transport{DialContext: s.ns.Dial, MaxIdleConnsPerHost: 16}
}

// waitBucket asks the gateway, signed with the server's identity, whether
// the bucket exists until it says yes, and fails the test if weed exits
// first or limit passes.
func (s *Server) waitBucket(ctx context.Context, limit time.Duration) {
	s.t.Helper()
	tr := s.Transport()
	defer tr.CloseIdleConnections()
	mc, err := minio.New(s.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(s.AccessKeyID, s.SecretAccessKey, ""),
		Transport: tr, BucketLookup: minio.BucketLookupPath})
	if err != nil {
		s.t.Fatal(err)
	}
	deadline := time.Now().Add(limit)
	last := ""
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			s.t.Fatalf("weed exited: %s; log tail:\n%s", s.cmd.ProcessState, s.logTail())
		default:
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ok, err := mc.BucketExists(cctx, s.Bucket)
		cancel()
		if ok {
			return
		}
		last = fmt.Sprintf("exists %v, err %v", ok, err)
		time.Sleep(200 * time.Millisecond)
	}
	s.t.Fatalf("SeaweedFS S3 bucket not ready in %s (last: %s); log tail:\n%s", limit, last, s.logTail())
}

func (s *Server) logTail() []byte {
	b, _ := os.ReadFile(filepath.Join(s.dir, "weed.log"))
	if len(b) > 8000 {
		b = b[len(b)-8000:]
	}
	return b
}

// stop ends weed: SIGTERM by pid, SIGKILL after 30 s.
func (s *Server) stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.done:
		case <-time.After(30 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.done
			s.t.Errorf("weed (pid %d) ignored SIGTERM for 30s", s.cmd.Process.Pid)
		}
	}
	if s.t.Failed() {
		s.t.Logf("weed log (tail):\n%s", s.logTail())
	}
	if s.log != nil {
		s.log.Close()
	}
	s.ns.Close()
}

func randHex(t testing.TB, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// testLog writes build progress to the test's log.
type testLog struct{ t testing.TB }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}
