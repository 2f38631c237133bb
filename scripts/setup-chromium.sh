#!/usr/bin/env bash
# Headless Chromium + chromedriver for the MiniWoB++ browser tasks (Debian packages chromium,
# chromium-driver). Idempotent: does nothing when both commands are already there.
set -euo pipefail

if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "setup-chromium: installing chromium and chromium-driver"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get install -y --no-install-recommends chromium chromium-driver >/dev/null 2>&1 || {
  $SUDO apt-get update >/dev/null
  $SUDO apt-get install -y --no-install-recommends chromium chromium-driver >/dev/null
}
command -v chromium >/dev/null && command -v chromedriver >/dev/null
echo "setup-chromium: $(chromium --version 2>/dev/null | head -1); $(chromedriver --version | head -1)"
