#!/usr/bin/env bash
# One command: install what is needed, then run Weir on its embedded default.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/weir up "$@"
