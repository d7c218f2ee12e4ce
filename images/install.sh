#!/usr/bin/env bash
# Install runner on a Linux host: build the three binaries, install them and
# the systemd unit, and enable runnerd. Idempotent; rerun it to upgrade.
#
#   sudo images/install.sh            # build, install, enable, (re)start
#   DESTDIR=/tmp/stage images/install.sh --no-start   # stage into a root for packaging
#
# An upgrade replaces the binaries and restarts runnerd only: the unit's
# KillMode=process leaves every session shim running, and the new runnerd
# adopts them from its registry (docs/operations.md).
set -euo pipefail

start=1
for arg in "$@"; do
  case "$arg" in
    --no-start) start=0 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done

src=$(cd "$(dirname "$0")/.." && pwd)
destdir=${DESTDIR:-}
bindir=${BINDIR:-/usr/local/bin}
unitdir=${UNITDIR:-/etc/systemd/system}

command -v go >/dev/null 2>&1 || PATH="$PATH:/usr/local/go/bin"
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
(cd "$src" && CGO_ENABLED=0 go build -trimpath -o "$build/" ./cmd/runnerd ./cmd/runner ./cmd/runner-shim)

install -d -m 0755 "$destdir$bindir" "$destdir$unitdir"
for b in runnerd runner runner-shim; do
  # install(1) writes a new inode and renames it into place, so a shim that
  # runs from the old binary keeps its mapping and the next spawn gets the new one.
  install -m 0755 "$build/$b" "$destdir$bindir/$b"
done
sed "s#/usr/local/bin#$bindir#g" "$src/systemd/runnerd.service" > "$build/runnerd.service"
install -m 0644 "$build/runnerd.service" "$destdir$unitdir/runnerd.service"

if [ "$start" = 1 ] && [ -z "$destdir" ] && command -v systemctl >/dev/null 2>&1; then
  systemctl daemon-reload
  systemctl enable runnerd.service
  systemctl restart runnerd.service
  echo "runnerd is running; the token is in /var/lib/runnerd/token"
else
  echo "installed into ${destdir:-/}; start with: systemctl enable --now runnerd"
fi
