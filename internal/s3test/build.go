package s3test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// SeaweedFSVersion is the module version of SeaweedFS built: a pseudo
// version of its master branch (the project tags releases without Go
// module tags), pinned so every run builds the same server.
const SeaweedFSVersion = "v0.0.0-20261109003541-7506e5f91cd6"

// seaweedModule is the Go module that holds the weed command.
const seaweedModule = "github.com/seaweedfs/seaweedfs"

// ErrNoModules is returned (wrapped) by Build when the module proxy
// cannot be reached or does not serve the modules: the server cannot be
// had on this host, which a test reports through testcap.Skip.
var ErrNoModules = errors.New("SeaweedFS modules cannot be downloaded")

// CacheDir is where the binary is built and kept: $RUNNER_S3_CACHE, or
// runner-test/seaweedfs-<version> under the user's cache directory.
func CacheDir() (string, error) {
	if d := os.Getenv("RUNNER_S3_CACHE"); d != "" {
		return d, nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("find cache dir: %w", err)
	}
	return filepath.Join(d, "runner-test", "seaweedfs-"+SeaweedFSVersion), nil
}

// goMod is the throwaway module that builds weed. SeaweedFS's own go.mod
// replaces one module; a replace applies only in the main module, so it
// is repeated here.
const goMod = `module runnertest/seaweedfs

go 1.26.0

require ` + seaweedModule + ` ` + SeaweedFSVersion + `

replace github.com/tyler-smith/go-bip39 => github.com/cosmos/go-bip39 v1.0.0
`

// toolsGo keeps weed's packages in the throwaway module's go.sum through
// go mod tidy.
const toolsGo = `//go:build tools

package seaweedfs

import _ "` + seaweedModule + `/weed"
`

// Build returns the cached weed binary, building it first when the cache
// does not hold this version's. The cache directory is locked for the
// build, so two test processes never build at once (the second waits and
// then finds the first's binary). The build runs under nice -n 19 and
// writes its progress to log. It needs the module proxy the first time;
// when the modules cannot be downloaded it returns an error wrapping
// ErrNoModules.
func Build(ctx context.Context, log io.Writer) (string, error) {
	dir, err := CacheDir()
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("make cache dir: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", fmt.Errorf("open cache lock: %w", err)
	}
	defer lock.Close() // closing the file releases the lock
	if err := flockCtx(ctx, lock); err != nil {
		return "", fmt.Errorf("lock cache dir %s: %w", dir, err)
	}
	bin := filepath.Join(dir, "bin", "weed")
	stamp := filepath.Join(dir, "bin", "stamp")
	want := stampOf()
	if got, err := os.ReadFile(stamp); err == nil && string(got) == want {
		if _, err := os.Stat(bin); err == nil {
			return bin, nil
		}
	}
	start := time.Now()
	fmt.Fprintf(log, "s3test: building SeaweedFS %s into %s (nice -n 19; minutes on a cold cache)\n", SeaweedFSVersion, dir)
	if err := build(ctx, dir, log); err != nil {
		return "", err
	}
	if err := os.WriteFile(stamp, []byte(want), 0o644); err != nil {
		return "", fmt.Errorf("write build stamp: %w", err)
	}
	fmt.Fprintf(log, "s3test: built in %s\n", time.Since(start).Round(time.Second))
	return bin, nil
}

// stampOf names what the cache's binary was built from.
func stampOf() string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%s\n%s\n", SeaweedFSVersion, goMod, toolsGo, runtime.Version())
	return hex.EncodeToString(h.Sum(nil)) + "\n"
}

// flockCtx takes an exclusive flock on f, giving up when ctx ends.
func flockCtx(ctx context.Context, f *os.File) error {
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func build(ctx context.Context, dir string, log io.Writer) error {
	src := filepath.Join(dir, "src")
	if err := os.RemoveAll(src); err != nil {
		return fmt.Errorf("clear build dir: %w", err)
	}
	if err := os.MkdirAll(src, 0o755); err != nil {
		return fmt.Errorf("make build dir: %w", err)
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	run := func(args ...string) error {
		argv := append([]string{goBin}, args...)
		if nice, err := exec.LookPath("nice"); err == nil {
			argv = append([]string{nice, "-n", "19"}, argv...)
		}
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.Dir = src
		// The throwaway module is built on its own: no workspace, and
		// GOFLAGS of the caller (say -mod=vendor) do not apply.
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod", "GOTOOLCHAIN=local")
		var out bytes.Buffer
		cmd.Stdout = &out
		cmd.Stderr = io.MultiWriter(&out, log)
		return cmd.Run()
	}
	for name, body := range map[string]string{"go.mod": goMod, "tools.go": toolsGo} {
		if err := os.WriteFile(filepath.Join(src, name), []byte(body), 0o644); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
	}
	if err := run("mod", "download", seaweedModule+"@"+SeaweedFSVersion); err != nil {
		return fmt.Errorf("download %s@%s: %w: %w", seaweedModule, SeaweedFSVersion, ErrNoModules, err)
	}
	if err := run("mod", "tidy"); err != nil {
		return fmt.Errorf("tidy the SeaweedFS module: %w: %w", ErrNoModules, err)
	}
	tmp := filepath.Join(dir, "bin.tmp")
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("clear bin.tmp: %w", err)
	}
	if err := run("build", "-trimpath", "-o", tmp+"/weed", seaweedModule+"/weed"); err != nil {
		return fmt.Errorf("build weed: %w", err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "bin")); err != nil {
		return fmt.Errorf("clear bin: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "bin")); err != nil {
		return fmt.Errorf("install weed: %w", err)
	}
	return nil
}
