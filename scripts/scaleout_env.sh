#!/usr/bin/env bash
# Make the scale-out test tier's services available (tests/scaleout, docs/scale-out.md):
# redis-server (Redis 7) and haproxy (2.6), which the tests start themselves on
# 127.0.0.1. Installed from Debian's packages when they are missing and this runs
# as root with apt; otherwise nothing is installed and the tier skips, saying why.
# Never fails the build: a missing service is a stated skip, not a red run.
set -uo pipefail
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v haproxy >/dev/null 2>&1 || missing+=(haproxy)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "scaleout: ${missing[*]} missing and cannot install them here (needs root and apt); the scale-out tests will skip" >&2
  exit 0
fi
echo "scaleout: installing ${missing[*]} (Debian packages; once)" >&2
if ! (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null); then
  echo "scaleout: could not install ${missing[*]}; the scale-out tests will skip" >&2
fi
exit 0
