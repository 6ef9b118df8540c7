#!/usr/bin/env bash
# Installs what Weir needs on a fresh Debian machine, idempotently:
# redis-server, mosquitto (the peer broker of `weir bench --vs`) and Java 17
# (PySpark's JVM, for the Spark jobs in streams/) from Debian when missing,
# then a virtualenv in .venv from requirements.lock. For the interop matrix
# (tests/interop): mosquitto-clients, Node.js, npm, Chromium and its driver
# from Debian when missing, and MQTT.js as pinned in
# tests/interop/js/package-lock.json. Chromium and its driver also run the
# dashboard's browser tests (tests/dashboard). Then the protocol core compiled
# with mypyc where a C compiler exists (scripts/build_core.py).
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || need_apt+=(mosquitto)
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
command -v mosquitto_pub >/dev/null 2>&1 || need_apt+=(mosquitto-clients)
command -v node >/dev/null 2>&1 || need_apt+=(nodejs)
command -v npm >/dev/null 2>&1 || need_apt+=(npm)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need_apt+=(chromium-driver)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]} from Debian" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
  # Debian starts these as services where systemd runs; Weir starts its own.
  $SUDO service mosquitto stop >/dev/null 2>&1 || true
  $SUDO service redis-server stop >/dev/null 2>&1 || true
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if [ ! -f .venv/.installed ] || [ requirements.lock -nt .venv/.installed ] || [ pyproject.toml -nt .venv/.installed ]; then
  .venv/bin/python -m pip install -q --upgrade pip uv
  .venv/bin/uv pip install -q --python .venv/bin/python -r requirements.lock
  .venv/bin/uv pip install -q --python .venv/bin/python --no-deps -e .
  touch .venv/.installed
fi

# Bytecode, compiled here once: uv installs without it, and where
# PYTHONDONTWRITEBYTECODE is set (CI runners, some shells) no process writes
# it, so every `weir` process compiled its imports from source again: about
# 1.5 s of CPU of every `weir up` start (2.2 s in all, 0.65 s from bytecode).
# compileall only rewrites what changed since.
if [ ! -f .venv/.compiled ] || [ .venv/.installed -nt .venv/.compiled ]; then
  # Some third-party files are not Python 3 (PySpark's examples); never imported.
  .venv/bin/python -m compileall -q -j 0 .venv/lib/python3*/site-packages >/dev/null 2>&1 || true
  touch .venv/.compiled
fi
.venv/bin/python -m compileall -q -j 0 services bench streams >/dev/null

# The protocol core (services/mqtt) compiled with mypyc, in place, when its
# sources changed since the last build; where no C compiler exists, or the
# build fails, one line says so and Weir runs as pure Python. WEIR_PURE=1
# skips it and removes a previous build.
.venv/bin/python scripts/build_core.py

js=tests/interop/js
if [ ! -f $js/node_modules/.package-lock.json ] || [ $js/package-lock.json -nt $js/node_modules/.package-lock.json ]; then
  (cd $js && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi
