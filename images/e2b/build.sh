#!/bin/sh
# Builds the runner-shim that images/e2b/e2b.Dockerfile copies into an E2B
# template: static (E2B's images vary in libc), linux/amd64 (E2B's
# Firecracker VMs), stamped with the version the adapter will demand
# (VERSION, else `git describe` of this checkout, as images/install.sh
# stamps runnerd).
set -eu
src=$(cd "$(dirname "$0")/../.." && pwd)
version=${VERSION:-$(git -c safe.directory="$src" -C "$src" describe --tags --always --dirty 2>/dev/null || echo dev)}
cd "$src"
CGO_ENABLED=0 GOOS=linux GOARCH=${GOARCH:-amd64} go build -trimpath -buildvcs=false \
  -ldflags "-X github.com/agentrunner/runner/version.Version=$version" \
  -o images/e2b/runner-shim ./cmd/runner-shim
echo "images/e2b/runner-shim $version"
