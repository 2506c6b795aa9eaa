#!/usr/bin/env bash
# Installs what germline's build and tests need on a fresh Debian machine: the C
# toolchain bits for RocksDB (libclang), iproute2 for test network namespaces, and a
# Python venv with the MCP SDK for the tool host. Idempotent; safe to re-run.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)

need_apt=()
for pkg in libclang-dev clang iproute2 git python3 python3-venv util-linux; do
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

# A second venv on Debian's interpreter, readable by any user: the unprivileged-path test
# runs germline as `nobody`, who cannot read a root-owned pyenv.
if [ "$(id -u)" = 0 ] && [ -x /usr/bin/python3 ]; then
  uvenv=/var/cache/germline/venv-unprivileged
  if [ ! -x "$uvenv/bin/python" ]; then
    mkdir -p /var/cache/germline
    /usr/bin/python3 -m venv "$uvenv"
  fi
  "$uvenv/bin/python" -m pip install -q --disable-pip-version-check -r "$here/scripts/requirements.txt"
  chmod -R a+rX "$uvenv"
fi
