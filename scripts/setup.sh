#!/usr/bin/env bash
# Installs what germline's build and tests need on a fresh Debian machine: the C
# toolchain bits for RocksDB (libclang), iproute2 for test network namespaces, and a
# Python venv with the MCP SDK for the tool host. Idempotent; safe to re-run.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)

need_apt=()
for pkg in libclang-dev clang iproute2 git; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

venv="${GERMLINE_VENV:-$here/.venv}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$here/scripts/requirements.txt"
