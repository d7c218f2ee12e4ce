#!/bin/sh
# Builds the runner-shim that images/e2b/e2b.Dockerfile copies into an E2B
# template (E2B's Firecracker VMs are linux/amd64). The build itself
# (static, linux/amd64, version-stamped) is images/build-shim.sh.
exec "$(dirname "$0")/../build-shim.sh" e2b
