#!/bin/sh
# Builds the runner-shim that images/daytona/Dockerfile copies into a
# Daytona snapshot, and that adapter/daytona can upload into a sandbox
# whose snapshot lacks it (AdapterConfig.ShimBinary): static (snapshots
# vary in libc), linux/amd64 (GOARCH to override), stamped with the
# version the adapter will demand (VERSION, else `git describe` of this
# checkout, as images/install.sh stamps runnerd).
set -eu
src=$(cd "$(dirname "$0")/../.." && pwd)
version=${VERSION:-$(git -c safe.directory="$src" -C "$src" describe --tags --always --dirty 2>/dev/null || echo dev)}
cd "$src"
CGO_ENABLED=0 GOOS=linux GOARCH=${GOARCH:-amd64} go build -trimpath -buildvcs=false \
  -ldflags "-X github.com/agentrunner/runner/version.Version=$version" \
  -o images/daytona/runner-shim ./cmd/runner-shim
echo "images/daytona/runner-shim $version"
