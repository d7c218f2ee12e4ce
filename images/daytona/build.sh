#!/bin/sh
# Builds the runner-shim that images/daytona/Dockerfile copies into a
# Daytona snapshot, and that adapter/daytona can upload into a sandbox
# whose snapshot lacks it (AdapterConfig.ShimBinary). The build itself
# (static, linux/amd64, version-stamped) is images/build-shim.sh.
exec "$(dirname "$0")/../build-shim.sh" daytona
