#!/bin/sh
# Installer of runnerd on this node (deploy/k8s). Runs in the privileged
# installer pod with the host's root at /host. Idempotent: every start
# installs what the image carries and restarts runnerd only when something
# changed. runnerd is a host systemd unit, not this pod: KillMode=process
# keeps every session's shim alive across the restart, and the new runnerd
# adopts them. Stopping this pod never stops runnerd.
#
#   install-host.sh            install or upgrade, then stay (the DaemonSet)
#   install-host.sh uninstall  stop runnerd, remove the unit and binaries
#                              (the cleanup DaemonSet, deploy/k8s/uninstall);
#                              RUNNER_REMOVE_STATE=1 also ends every session
#                              and removes /var/lib/runnerd
#
# The RUNNER_* variables exist so deploy_test.go can replay this script on a
# directory and a stand-in for the host's systemd; the pod sets none of them.
set -eu

root=${RUNNER_HOST_ROOT:-/host}
src=${RUNNER_SRC:-/opt/runner/bin}
files=${RUNNER_FILES:-/opt/runner/host-files}
tls=${RUNNER_TLS:-/opt/runner/tls}   # the runnerd-tls Secret
changed=0

host() {
  if [ -n "${RUNNER_HOST_EXEC:-}" ]; then $RUNNER_HOST_EXEC "$@"; return; fi
  nsenter --target 1 --mount --uts --ipc --net --pid -- "$@"
}

put() { # put SRC DEST MODE: install SRC at DEST when it differs
  if ! cmp -s "$1" "$root$2"; then
    install -D -m "$3" "$1" "$root$2.new"
    mv -f "$root$2.new" "$root$2"   # rename: a running shim keeps its old inode
    changed=1
  fi
}

# sync_tls copies the Secret's files to the host. runnerd re-reads its
# certificate when the files change, so a rotation needs no restart and
# does not count as a change.
sync_tls() {
  was=$changed
  for f in tls.crt tls.key ca.crt; do
    if [ -f "$tls/$f" ]; then put "$tls/$f" "/etc/runnerd/tls/$f" 0600; fi
  done
  changed=$was
}

# stay SECONDS CMD: stay until TERM or INT (the pod's stop), running CMD
# every SECONDS, then exit 0 without touching runnerd. It naps a second at
# a time, a child the trap ends: a signal that lands between the fork and
# the wait (the shell then waits the nap out) costs a second, not SECONDS,
# and no nap outlives the script (outside a pod's pid namespace, on a
# host, nothing else would end it).
stop=0 nap=
trap 'stop=1; if [ -n "$nap" ]; then kill "$nap" 2>/dev/null || true; fi' TERM INT
stay() {
  n=0
  while [ "$stop" = 0 ]; do
    sleep 1 & nap=$!
    wait "$nap" || true
    n=$((n + 1))
    if [ "$stop" = 0 ] && [ "$n" -ge "$1" ]; then n=0; "$2"; fi
  done
  exit 0
}

if [ "${1:-}" = uninstall ]; then
  if [ "${RUNNER_REMOVE_STATE:-0}" = 1 ]; then
    # KillMode=process leaves the shims running at a stop: end them (and
    # their sessions) while the unit still holds them.
    host systemctl kill --kill-whom=all --signal=SIGTERM runnerd.service || true
  fi
  host systemctl disable --now runnerd.service || true
  rm -f "$root/etc/systemd/system/runnerd.service" \
        "$root/etc/systemd/system/runnerd.service.d/fleet.conf" \
        "$root/usr/local/bin/runnerd" "$root/usr/local/bin/runner-shim" "$root/usr/local/bin/runner"
  rmdir "$root/etc/systemd/system/runnerd.service.d" 2>/dev/null || true
  rm -rf "$root/etc/runnerd"
  host systemctl daemon-reload
  if [ "${RUNNER_REMOVE_STATE:-0}" = 1 ]; then
    rm -rf "$root/var/lib/runnerd"
    echo "runnerd removed, state removed"
  else
    echo "runnerd removed; state kept in /var/lib/runnerd (RUNNER_REMOVE_STATE=1 removes it)"
  fi
  stay 3600 :
fi

# The token of deploy/k8s/token.env as shipped, or none, is no credential:
# refuse before touching the host, so a forgotten edit never runs a fleet
# anyone who read the repository can drive.
case "${RUNNERD_TOKEN:-}" in
  ""|change-me-before-applying)
    echo "install-host.sh: RUNNERD_TOKEN is unset or the placeholder of token.env; put a real token (openssl rand -hex 32) in deploy/k8s/token.env and apply again" >&2
    exit 1 ;;
esac
if [ "${#RUNNERD_TOKEN}" -lt 32 ]; then
  echo "install-host.sh: RUNNERD_TOKEN is shorter than 32 characters; use openssl rand -hex 32" >&2
  exit 1
fi
if [ ! -f "$tls/tls.crt" ] || [ ! -f "$tls/tls.key" ] || [ ! -f "$tls/ca.crt" ]; then
  echo "install-host.sh: no tls.crt, tls.key and ca.crt in $tls: create the runnerd-tls Secret (docs/operations.md, TLS)" >&2
  exit 1
fi

for b in runnerd runner-shim runner; do
  put "$src/$b" "/usr/local/bin/$b" 0755
done
put "$files/runnerd.service" /etc/systemd/system/runnerd.service 0644
put "$files/fleet.conf" /etc/systemd/system/runnerd.service.d/fleet.conf 0644
umask 077
printf 'RUNNERD_TOKEN=%s\n' "$RUNNERD_TOKEN" > "${TMPDIR:-/tmp}/fleet.env"
put "${TMPDIR:-/tmp}/fleet.env" /etc/runnerd/fleet.env 0600
rm -f "${TMPDIR:-/tmp}/fleet.env"
sync_tls

host systemctl daemon-reload
host systemctl enable runnerd.service
if [ "$changed" = 1 ] || ! host systemctl is-active --quiet runnerd.service; then
  host systemctl restart runnerd.service
fi
echo "runnerd installed and running on $(cat "$root/etc/hostname" 2>/dev/null || hostname)"

# Stay, so the DaemonSet shows the node installed (readiness asks runnerd
# through its socket), copying a rotated certificate within a minute;
# exit quietly on TERM without touching runnerd.
stay "${RUNNER_TLS_SYNC:-60}" sync_tls
