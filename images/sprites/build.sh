#!/bin/sh
# Builds the runner-shim that adapter/sprites uploads into every sprite it
# creates: static (no libc assumptions about the sprite's image),
# linux/amd64 (Sprites' machines), stamped with the version the adapter
# will demand (VERSION, else `git describe` of this checkout, as
# images/install.sh stamps runnerd). Nothing is baked into an image:
# Sprites has none to customise. Point AdapterConfig.ShimBinary at the
# file this writes (or embed it).
set -eu
src=$(cd "$(dirname "$0")/../.." && pwd)
version=${VERSION:-$(git -c safe.directory="$src" -C "$src" describe --tags --always --dirty 2>/dev/null || echo dev)}
cd "$src"
CGO_ENABLED=0 GOOS=linux GOARCH=${GOARCH:-amd64} go build -trimpath -buildvcs=false \
  -ldflags "-X github.com/agentrunner/runner/version.Version=$version" \
  -o images/sprites/runner-shim ./cmd/runner-shim
echo "images/sprites/runner-shim $version"
