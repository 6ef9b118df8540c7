#!/usr/bin/env bash
# One command: install what is needed, then run the whole test suite
# (fixtures start their own redis-server and embedded Kafka on free ports).
#
# Arguments go to pytest (e.g. -m "not slow", or test paths).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/mypy
.venv/bin/lint-imports --no-cache --no-logo  # the import contracts in pyproject.toml
if [ $# -eq 0 ]; then
  # The suite runs against the compiled core; tests/mqtt once more against its
  # sources (services/mqtt/__init__.py: WEIR_PURE=1 hides the compiled modules).
  WEIR_PURE=1 .venv/bin/python -m pytest -q -p no:cacheprovider tests/mqtt
fi
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"  # pyproject: testpaths = tests
