#!/usr/bin/env bash
# Debian's Chromium for the dashboard's browser test (tests/test_study_tools.py). Idempotent; run as root.
# Prints the browser's path. The test runs it headless with:
#   --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking
#   --disable-component-update --disable-sync --user-data-dir=<tmp>
set -euo pipefail
if [ ! -x /usr/bin/chromium ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
fi
/usr/bin/chromium --version >&2
echo /usr/bin/chromium
