#!/usr/bin/env bash
# Debian's chromium (/usr/bin/chromium) drives the browser tests and kaleido's PNG/SVG export
# (`make test`, `make demo`); nothing ever downloads a browser.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then exit 0; fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "[install] apt-get install chromium"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
else
  echo "[install] /usr/bin/chromium missing and not root: browser tests will be skipped and" \
    "reports (make demo, workbench report) will have HTML figures only, no PNG/SVG" >&2
fi
