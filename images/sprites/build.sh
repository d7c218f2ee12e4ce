#!/bin/sh
# Builds the runner-shim that adapter/sprites uploads into every sprite it
# creates. Nothing is baked into an image: Sprites has none to customise.
# Point AdapterConfig.ShimBinary at the file this writes (or embed it).
# The build itself (static, linux/amd64, version-stamped) is
# images/build-shim.sh.
exec "$(dirname "$0")/../build-shim.sh" sprites
