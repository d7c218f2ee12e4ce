package move

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/client/fleet"
	"github.com/agentrunner/runner/internal/runnerdtest"
	"github.com/agentrunner/runner/internal/s3test"
	"github.com/agentrunner/runner/wire"
)

// The figures, each beside its baseline in the same run (on a
// quiet machine: runnerd, the S3 server and zstd use every core):
//
//	MOVE_BENCH_BYTES=1073741824 MOVE_BENCH_FILES=10000 \
//	  go test -run '^$' -bench Move -benchtime 3x ./client/fleet/move/
//
//	BenchmarkMove/archive-upload     park, checkpoint, checkpoint and session archives into the bucket
//	BenchmarkMove/tar-zstd-1-upload  tar | zstd -1 of the workspace into the bucket, same client
//	BenchmarkMove/download-restore   create, import, restore and import sessions on another runnerd
//	BenchmarkMove/download-unzstd-untar  the bucket's tar.zst through zstd -d | tar -x
//
// The workspace holds MOVE_BENCH_BYTES in MOVE_BENCH_FILES files, half
// random bytes and half text (about 2x compressible). Unset, 8 MiB in
// 100 files: MOVE_BENCH_BYTES=1048576 MOVE_BENCH_FILES=10 -benchtime 1x
// only proves they run. Needs root (cgroups for checkpoints, the S3
// server's namespace).
func BenchmarkMove(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root: checkpoints need cgroups")
	}
	size, files := int64(8<<20), 100
	if v, err := strconv.ParseInt(os.Getenv("MOVE_BENCH_BYTES"), 10, 64); err == nil && v > 0 {
		size = v
	}
	if v, err := strconv.Atoi(os.Getenv("MOVE_BENCH_FILES")); err == nil && v > 0 {
		files = v
	}
	ctx := context.Background()
	srv := s3test.Start(b)
	tr := srv.Transport()
	defer tr.CloseIdleConnections()
	st, err := Open(ctx, Config{Endpoint: srv.Endpoint, Bucket: srv.Bucket, Prefix: "bench/", Transport: tr,
		Credentials: Credentials{AccessKeyID: srv.AccessKeyID, SecretAccessKey: srv.SecretAccessKey}})
	if err != nil {
		b.Fatal(err)
	}
	bin, err := runnerdtest.Build(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	ua, ub := benchRunnerd(b, bin), benchRunnerd(b, bin)
	pool, err := fleet.New(ctx, fleet.Static{{Name: "ra", URL: ua, Token: benchToken}, {Name: "rb", URL: ub, Token: benchToken}}, fleet.Options{Refresh: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	src, _ := pool.Client("ra")
	dst, _ := pool.Client("rb")
	m := New(pool, st, Options{Holder: "bench"})
	const name = "ra-bench"
	sb, err := src.CreateSandbox(ctx, wire.CreateSandbox{Name: name})
	if err != nil {
		b.Fatal(err)
	}
	fillTree(b, sb.WorkspaceOnHost(), size, files)
	if _, err := src.Exec(ctx, name, wire.Exec{Argv: []string{"true"}}); err != nil { // one ended session
		b.Fatal(err)
	}

	var man Manifest
	b.Run("archive-upload", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			if man, err = m.archive(ctx, src, "ra", name); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(man.CheckpointBytes+man.SessionsBytes), "archive-bytes")
	})
	b.Run("download-restore", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			if err := m.restore(ctx, dst, man); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if err := dst.DeleteSandbox(ctx, name); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	})
	if _, err := exec.LookPath("zstd"); err != nil {
		b.Skip("no zstd binary for the baseline")
	}
	key := st.key("bench", "workspace.tar.zst")
	b.Run("tar-zstd-1-upload", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			cmd := exec.Command("sh", "-c", `tar -C "$1" -cf - . | zstd -1 -q -T0`, "sh", sb.WorkspaceOnHost())
			out, err := cmd.StdoutPipe()
			if err != nil {
				b.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			_, perr := st.put(ctx, key, out, -1, minio.PutObjectOptions{})
			if err := cmd.Wait(); err != nil || perr != nil {
				b.Fatal(err, perr)
			}
		}
	})
	b.Run("download-unzstd-untar", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			b.StopTimer()
			dir := b.TempDir()
			b.StartTimer()
			obj, _, err := st.get(ctx, key)
			if err != nil {
				b.Fatal(err)
			}
			cmd := exec.Command("sh", "-c", `zstd -d -q | tar -C "$1" -xf -`, "sh", dir)
			cmd.Stdin = obj
			if out, err := cmd.CombinedOutput(); err != nil {
				b.Fatalf("%v: %s", err, out)
			}
			obj.Close()
		}
	})
}

const benchToken = "move-bench-token-0123456789"

// benchRunnerd starts runnerd with cgroups under a root of its own, and
// stops it (destroying its sandboxes first) at cleanup.
func benchRunnerd(b *testing.B, bin string) string {
	b.Helper()
	state := b.TempDir()
	os.Chmod(filepath.Dir(state), 0o711)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	root := fmt.Sprintf("/runner-move-bench-%d-%s-%s", os.Getpid(), filepath.Base(filepath.Dir(state)), filepath.Base(state))
	cmd := exec.Command(bin, "--state", state, "--listen", addr, "--socket", "none", "--netpolicy", "off",
		"--cgroups", "auto", "--cgroup-root", root, "--warm-shims", "0")
	cmd.Env = append(os.Environ(), "RUNNERD_TOKEN="+benchToken)
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	url := "http://" + addr
	b.Cleanup(func() {
		if c, err := client.New(url, benchToken, client.Options{}); err == nil {
			if sbs, err := c.ListAllSandboxes(context.Background()); err == nil {
				for _, sb := range sbs {
					_ = c.DeleteSandbox(context.Background(), sb.Name)
				}
			}
			c.Close()
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		runnerdtest.KillShims(state)
		dirs, _ := filepath.Glob("/sys/fs/cgroup/*" + root)
		for _, d := range dirs {
			os.Remove(d)
		}
	})
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if resp, err := http.Get(url + "/healthz"); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return url
		}
	}
	b.Fatalf("runnerd on %s did not answer", addr)
	return ""
}

// fillTree writes size bytes in files files under dir: half random, half
// text, as checkpoint/bench_test.go's tree.
func fillTree(b *testing.B, dir string, size int64, files int) {
	b.Helper()
	per := int(size / int64(files))
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, per)
	for i := range files {
		p := filepath.Join(dir, fmt.Sprintf("d%02d", i%100), fmt.Sprintf("f%05d", i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			b.Fatal(err)
		}
		for j := 0; j < per/2; j++ {
			buf[j] = byte(r.Uint32())
		}
		for j := per / 2; j < per; j++ {
			buf[j] = "the quick brown fox jumps over the lazy dog\n"[j%44]
		}
		if err := os.WriteFile(p, buf, 0o644); err != nil {
			b.Fatal(err)
		}
	}
}
