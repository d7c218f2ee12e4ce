#!/usr/bin/env bash
# Install runner on a Linux host: build the three binaries, install them and
# the systemd unit, and enable runnerd. Idempotent; rerun it to upgrade. On a
# host that does not run systemd it starts nothing and prints how to start
# runnerd instead.
#
#   sudo images/install.sh            # build, install, enable, (re)start
#   DESTDIR=/tmp/stage images/install.sh --no-start   # stage into a root for packaging
#
# An upgrade replaces the binaries and restarts runnerd only: the unit's
# KillMode=process leaves every session shim running, and the new runnerd
# adopts them from its registry (docs/operations.md).
#
# The binaries carry one version (runnerd --version, /healthz, runner
# version), in the form a plain `go build` of the same checkout has (see
# package version): the vX.Y.Z tag of a clean tagged commit, else
# dev-<12 hex digits of the commit>, with -dirty when the tree has
# changes; or VERSION=... from the caller. `install.sh --print-version`
# prints it and does nothing else.

set -euo pipefail

start=1
print_version=0
for arg in "$@"; do
  case "$arg" in
    --no-start) start=0 ;;
    --print-version) print_version=1 ;;
    -h|--help) sed -n '2,/^$/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done

src=$(cd "$(dirname "$0")/.." && pwd)
destdir=${DESTDIR:-}
bindir=${BINDIR:-/usr/local/bin}
unitdir=${UNITDIR:-/etc/systemd/system}
docdir=${DOCDIR:-/usr/local/share/doc/runner}

command -v go >/dev/null 2>&1 || PATH="$PATH:/usr/local/go/bin"
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
# Go's own VCS stamping asks git, which refuses a checkout owned by another
# user (the usual `sudo images/install.sh` case: "error obtaining VCS
# status"). So the version is asked of git here, with this one checkout
# marked safe for this one command, and stamped with -ldflags; -buildvcs=false
# keeps go build from asking again.
git_() { git -c safe.directory="$src" -C "$src" "$@"; }
checkout_version() {
  local rev dirty= tag
  rev=$(git_ rev-parse HEAD 2>/dev/null) || { echo dev; return; }
  # Go's vcs.modified: any line of git status --porcelain, untracked files too.
  [ -n "$(git_ status --porcelain 2>/dev/null)" ] && dirty=1
  tag=$(git_ tag --points-at HEAD 2>/dev/null | grep -E '^v[0-9]+\.[0-9]+\.[0-9]+$' | sort -V | tail -n 1)
  if [ -n "$tag" ] && [ -z "$dirty" ]; then
    echo "$tag"
  else
    echo "dev-${rev:0:12}${dirty:+-dirty}"
  fi
}
version=${VERSION:-$(checkout_version)}
if [ "$print_version" = 1 ]; then
  echo "$version"
  exit 0
fi
# runnerd and runner-shim join a sandbox's pod through a C constructor
# (package shim/podjoin): built without cgo they refuse every pod start
# (ENOTSUP), so they are built with it, which needs a C compiler and the C
# library's headers (Debian: gcc libc6-dev). The netgo and osusergo tags
# keep the pure-Go resolver and user lookups a CGO_ENABLED=0 build has, so
# the constructor is the only C in them. CGO_ENABLED=0 from the caller
# builds them without (no pods). The client, runner, needs no C.
cgo=${CGO_ENABLED:-1}
if [ "$cgo" != 0 ]; then
  cgo=1
  cc=${CC:-gcc}
  if ! printf '#define _GNU_SOURCE\n#include <sched.h>\n#include <unistd.h>\nint main(void) { return setns(0, CLONE_NEWNS); }\n' |
    "$cc" -x c -o "$build/cc-check" - >/dev/null 2>&1; then
    echo "install.sh: runnerd and runner-shim need cgo to start pods, and '$cc' cannot build C here." >&2
    echo "Install a C compiler and the C library's headers (Debian: apt-get install gcc libc6-dev)," >&2
    echo "or build them without pods: CGO_ENABLED=0 $0" >&2
    exit 1
  fi
else
  echo "install.sh: CGO_ENABLED=0: runnerd and runner-shim are built without the pod join; every pod start fails (ENOTSUP)" >&2
fi
ldflags="-X github.com/agentrunner/runner/version.Version=$version"
(cd "$src" && CGO_ENABLED=$cgo go build -buildvcs=false -trimpath -tags netgo,osusergo \
  -ldflags "$ldflags" -o "$build/" ./cmd/runnerd ./cmd/runner-shim)
(cd "$src" && CGO_ENABLED=0 go build -buildvcs=false -trimpath \
  -ldflags "$ldflags" -o "$build/" ./cmd/runner)

install -d -m 0755 "$destdir$bindir" "$destdir$unitdir" "$destdir$docdir"
for b in runnerd runner runner-shim; do
  # install(1) writes a new inode and renames it into place, so a shim that
  # runs from the old binary keeps its mapping and the next spawn gets the new one.
  install -m 0755 "$build/$b" "$destdir$bindir/$b"
done
# The unit's Documentation= names these pages.
for d in "$src"/docs/*.md "$src/README.md"; do
  install -m 0644 "$d" "$destdir$docdir/$(basename "$d")"
done
sed -e "s#/usr/local/bin#$bindir#g" -e "s#/usr/local/share/doc/runner#$docdir#g" \
  "$src/systemd/runnerd.service" > "$build/runnerd.service"
install -m 0644 "$build/runnerd.service" "$destdir$unitdir/runnerd.service"

# systemd runs this host when /run/systemd/system exists (sd_booted(3)); a
# systemctl binary alone (a container, another init) would only fail.
systemd=0
[ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1 && systemd=1
if [ "$start" = 1 ] && [ -z "$destdir" ] && [ "$systemd" = 1 ]; then
  systemctl daemon-reload
  systemctl enable runnerd.service
  systemctl restart runnerd.service
  echo "runnerd $version is running; the token is in /var/lib/runnerd/token"
elif [ "$systemd" = 1 ] || [ -n "$destdir" ]; then
  echo "runner $version installed into ${destdir:-/}; start with: systemctl enable --now runnerd"
else
  echo "runner $version installed into /; this host does not run systemd, so nothing was started."
  echo "Start runnerd as root under your init system or a supervisor:"
  echo "  $bindir/runnerd --shim $bindir/runner-shim"
  echo "Stop it with SIGTERM to its pid only (its session shims must keep running: what the"
  echo "unit's KillMode=process does); its state and token are in /var/lib/runnerd."
fi
