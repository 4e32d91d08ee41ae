#!/usr/bin/env bash
# Make sure Debian's Chromium is installed at /usr/bin/chromium: the ui's browser tests
# (tests/ui/test_browser.py) drive it headless with Playwright, which is told to use it
# (no `playwright install`, which downloads a browser build of its own).
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
echo "Chromium not found; installing it from Debian's packages" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
test -x /usr/bin/chromium
