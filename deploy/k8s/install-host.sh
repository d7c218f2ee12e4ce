#!/bin/sh
# Installer of runnerd on this node (deploy/k8s). Runs in the privileged
# installer pod with the host's root at /host. Idempotent: every start
# installs what the image carries and restarts runnerd only when something
# changed. runnerd is a host systemd unit, not this pod: KillMode=process
# keeps every session's shim alive across the restart, and the new runnerd
# adopts them. Stopping this pod never stops runnerd.
set -eu

src=/opt/runner/bin
files=/opt/runner/host-files
changed=0

put() { # put SRC DEST MODE: install SRC at DEST when it differs
  if ! cmp -s "$1" "/host$2"; then
    install -D -m "$3" "$1" "/host$2.new"
    mv -f "/host$2.new" "/host$2"   # rename: a running shim keeps its old inode
    changed=1
  fi
}

for b in runnerd runner-shim runner; do
  put "$src/$b" "/usr/local/bin/$b" 0755
done
put "$files/runnerd.service" /etc/systemd/system/runnerd.service 0644
put "$files/fleet.conf" /etc/systemd/system/runnerd.service.d/fleet.conf 0644
umask 077
printf 'RUNNERD_TOKEN=%s\n' "$RUNNERD_TOKEN" > /tmp/fleet.env
put /tmp/fleet.env /etc/runnerd/fleet.env 0600

host() { nsenter --target 1 --mount --uts --ipc --net --pid -- "$@"; }
host systemctl daemon-reload
host systemctl enable runnerd.service
if [ "$changed" = 1 ] || ! host systemctl is-active --quiet runnerd.service; then
  host systemctl restart runnerd.service
fi
echo "runnerd installed and running on $(cat /host/etc/hostname 2>/dev/null || hostname)"

# Stay, so the DaemonSet shows the node installed (readiness asks runnerd
# through its socket); exit quietly on TERM without touching runnerd.
trap 'exit 0' TERM INT
while :; do sleep 3600 & wait $!; done
