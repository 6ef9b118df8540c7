#!/usr/bin/env bash
# One command: install what is needed, then run the whole test suite
# (fixtures start their own redis-server and embedded Kafka on free ports).
#
# Arguments go to pytest (e.g. -m "not slow", or test paths), in both parts:
# first every test not marked `serial` on two xdist workers (most tests wait
# on sockets and subprocesses, not the CPU), then the `serial` ones (the
# SIGKILL chaos runs, which load the whole machine) alone in one process.
# tests/support/parallel.py says how the workers share the tests; `-n 0`
# among the arguments runs the first part in one process too.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/mypy
.venv/bin/lint-imports --no-cache --no-logo  # the import contracts in pyproject.toml
# pytest caches its assertion-rewritten test modules as bytecode only where
# Python may write bytecode: without this, each pytest process (the pure
# tests/mqtt pass, two workers, the serial part) rewrites the test modules again.
unset PYTHONDONTWRITEBYTECODE
pytest=(.venv/bin/python -m pytest -q -p no:cacheprovider)  # pyproject: testpaths = tests
if [ $# -eq 0 ]; then
  # The suite runs against the compiled core; tests/mqtt once more against its
  # sources (services/mqtt/__init__.py: WEIR_PURE=1 hides the compiled modules).
  WEIR_PURE=1 "${pytest[@]}" -n 2 tests/mqtt
fi
set +e
"${pytest[@]}" -n 2 --part parallel "$@"
parallel=$?
if [ "$parallel" -gt 1 ] && [ "$parallel" -ne 5 ]; then
  exit "$parallel"  # interrupted, a usage error or an internal error: stop here
fi
"${pytest[@]}" --part serial "$@"
serial=$?
# 5 is "no tests collected": fine for one part (given paths without serial
# tests, or only serial ones), not for both.
if [ "$parallel" -eq 5 ] && [ "$serial" -eq 5 ]; then exit 5; fi
for code in "$parallel" "$serial"; do
  if [ "$code" -ne 0 ] && [ "$code" -ne 5 ]; then exit "$code"; fi
done
exit 0
