#!/usr/bin/env bash
# Install what the browser test (tests/browser/test_lab_e2e.py) needs, and only what is missing:
# Debian's Chromium (/usr/bin/chromium) and Playwright for Python in the course's virtualenv.
# Playwright drives that Chromium; it never downloads a browser of its own (no `playwright install`).
# Idempotent: a second run changes nothing. Needs root (or sudo) for apt-get when Chromium is missing.
#
#   VENV=.venv tests/browser/install.sh        (VENV defaults to .venv)
set -euo pipefail

VENV="${VENV:-.venv}"

if [ ! -x /usr/bin/chromium ]; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update
    $SUDO apt-get install -y --no-install-recommends chromium fonts-dejavu-core
fi

if ! "$VENV/bin/python" -c "import playwright.sync_api" 2>/dev/null; then
    "$VENV/bin/python" -m pip install playwright
fi

/usr/bin/chromium --version
"$VENV/bin/python" -c "import importlib.metadata as m; print('playwright', m.version('playwright'))"
