#!/bin/sh
# Builds runner-shim for a hosted provider's image into images/PROVIDER/:
# static (the providers' images vary in libc), linux/amd64 (GOARCH to
# override), stamped with the version the adapter will demand (VERSION,
# else `git describe` of this checkout, as images/install.sh stamps
# runnerd). images/daytona, images/e2b and images/sprites call it from
# their build.sh; what each does with the binary is in its README.
set -eu
case ${1:-} in
daytona | e2b | sprites) ;;
*)
  echo "usage: images/build-shim.sh daytona|e2b|sprites" >&2
  exit 2
  ;;
esac
src=$(cd "$(dirname "$0")/.." && pwd)
version=${VERSION:-$(git -c safe.directory="$src" -C "$src" describe --tags --always --dirty 2>/dev/null || echo dev)}
cd "$src"
CGO_ENABLED=0 GOOS=linux GOARCH=${GOARCH:-amd64} go build -trimpath -buildvcs=false \
  -ldflags "-X github.com/agentrunner/runner/version.Version=$version" \
  -o "images/$1/runner-shim" ./cmd/runner-shim
echo "images/$1/runner-shim $version"
