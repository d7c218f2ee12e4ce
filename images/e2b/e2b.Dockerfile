# An E2B template with runner-shim in it, for adapter/e2b
# (docs/providers/e2b.md). E2B builds templates from a Dockerfile; the
# adapter runs every session command through /usr/local/bin/runner-shim
# and refuses a sandbox whose runner-shim is not of its own version, so
# build this with the same VERSION the adapter's binary carries.
#
# From the repository root (VERSION defaults to `git describe`):
#
#   images/e2b/build.sh            # builds runner-shim into images/e2b/
#   e2b template build -c "/root/.jupyter/start-up.sh" \
#       --dockerfile images/e2b/e2b.Dockerfile --name runner
#
# or, for the E2B base image without the code interpreter:
#
#   e2b template build --dockerfile images/e2b/e2b.Dockerfile --name runner
#
# The fragment to add to an existing template is the COPY and RUN below.
FROM e2bdev/code-interpreter:latest
COPY images/e2b/runner-shim /usr/local/bin/runner-shim
# Fail the build, not the first sandbox, when the binary cannot run here.
RUN chmod 0755 /usr/local/bin/runner-shim && /usr/local/bin/runner-shim --version
