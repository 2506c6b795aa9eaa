#!/usr/bin/env bash
# Installs what germline's build and tests need on a fresh Debian machine: the C
# toolchain bits for RocksDB (libclang), iproute2 for test network namespaces, pandoc for
# the compatibility corpus (mcp-pandoc runs it), curl and jq for the README's quick starts,
# and a Python venv with the MCP SDK for the tool host. Idempotent; safe to re-run.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)

need_apt=()
for pkg in libclang-dev clang g++ iproute2 git sqlite3 python3 python3-venv util-linux pandoc curl jq; do
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

# A venv on CPython 3.12 or 3.13 where the machine has one (pyenv's, or a system one):
# germlines on those make their heap immortal before forking (PEP 683), and
# `tests/immortal_heap.rs` and a pass of the security tests run on it. Optional: without
# such an interpreter those tests say so, and the suite runs on the default venv.
imm_venv=/var/cache/germline/venv-immortal
if [ ! -x "$imm_venv/bin/python" ]; then
  for py in /root/.pyenv/versions/3.12*/bin/python3 /root/.pyenv/versions/3.13*/bin/python3 \
            /usr/bin/python3.12 /usr/bin/python3.13 /usr/local/bin/python3.12 /usr/local/bin/python3.13; do
    if [ -x "$py" ] && "$py" -c 'import sys, sysconfig; sys.exit(not (sys.version_info[:2] in ((3, 12), (3, 13)) and not sysconfig.get_config_var("Py_GIL_DISABLED")))' 2>/dev/null \
       && "$py" -m venv "$imm_venv.tmp" 2>/dev/null; then
      mv "$imm_venv.tmp" "$imm_venv"
      break
    fi
    rm -rf "$imm_venv.tmp"
  done
fi
if [ -x "$imm_venv/bin/python" ]; then
  "$imm_venv/bin/python" -m pip install -q --disable-pip-version-check --cache-dir /var/cache/germline/pip-cache \
    -r "$here/scripts/requirements.txt"
fi

# schemathesis in its own venv (its pins must not move the tool host's): the service test
# fuzzes `germline serve` from its OpenAPI document.
st_venv=/var/cache/germline/venv-schemathesis
st_version=4.32.5
if [ ! -x "$st_venv/bin/schemathesis" ] || [ "$(cat "$st_venv/.version" 2>/dev/null)" != "$st_version" ]; then
  mkdir -p /var/cache/germline/pip-cache
  python3 -m venv "$st_venv"
  "$st_venv/bin/python" -m pip install -q --disable-pip-version-check --cache-dir /var/cache/germline/pip-cache \
    "schemathesis==$st_version"
  echo "$st_version" >"$st_venv/.version"
fi

# Unmodified official MCP servers from PyPI, vendored into release directories for the
# compatibility tests and `germline bench --server` (pinned; downloads cached). The two
# older mcp-server-git releases sit on either side of the upstream dash-target fix
# (2025.12.18 added the `target.startswith("-")` rejection to git_diff) for the
# formation-consistent dispatch tests and `germline-eval fcd`.
# `datasci` is numpy, pandas and scikit-learn for the native-library tests; the other
# additions are the issue-16 compatibility corpus (docs/compatibility.md).
real="${GERMLINE_REAL_SERVERS:-/var/cache/germline/real-servers}"
mkdir -p "$real" /var/cache/germline/pip-cache
for spec in "time mcp-server-time==2026.10.19" "git mcp-server-git==2026.10.19" \
  "fetch mcp-server-fetch==2026.10.24" "sqlite mcp-server-sqlite==2025.4.25 mcp==1.30.0" \
  "datasci numpy==2.4.6 pandas==3.1.1 scikit-learn==1.9.1 scipy==1.17.1" \
  "duckdb mcp-server-duckdb==1.1.0 mcp==1.30.0" "excel excel-mcp-server==2.2.2" \
  "make mcp-server-make==0.4.0 mcp==1.30.0" "calculator mcp-server-calculator==0.2.1" \
  "word office-word-mcp-server==1.1.11" \
  "pptx office-powerpoint-mcp-server==2.0.7 mcp==1.30.0" "treesitter mcp-server-tree-sitter==0.7.0 mcp==1.30.0" \
  "climcp cli-mcp-server==0.2.5 mcp==1.30.0" "shell mcp-shell-server==1.1.14 mcp==1.30.0" \
  "jupyter mcp-server-jupyter==0.1.9 mcp==1.30.0" "codeindex code-index-mcp==2.17.1" \
  "dbsqlite database-mcp-sqlite==0.2.1" "pandoc mcp-pandoc==0.11.1" "rss mcp-server-rss==0.1.0 mcp==1.30.0" \
  "ddg duckduckgo-mcp-server==0.7.0" "webcal webcal-mcp==0.2.3 mcp==1.30.0" \
  "pdftools fastmcp-pdftools==0.1.3" "motherduck mcp-server-motherduck==1.1.0" \
  "git-2025.11.25 mcp-server-git==2025.11.25 mcp==1.30.0" "git-2025.12.18 mcp-server-git==2025.12.18 mcp==1.30.0"; do
  read -r name reqs <<<"$spec"
  if [ ! -f "$real/$name/.complete" ] || [ "$(cat "$real/$name/.complete")" != "$reqs" ]; then
    rm -rf "$real/$name"
    # shellcheck disable=SC2086
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --cache-dir /var/cache/germline/pip-cache \
      --target "$real/$name/vendor" $reqs
    echo "$reqs" >"$real/$name/.complete"
  fi
done
# Official mcp-server-git wheels (no dependencies) on both sides of the dash-target fix,
# for the reference profile's stock check: only their server.py is parsed, never run.
wheels="$real/git-wheels"
mkdir -p "$wheels"
for v in 2025.1.14 2025.7.1 2025.9.25 2025.11.25 2025.12.18 2026.1.14 2026.6.4 2026.10.19; do
  if ! ls "$wheels/mcp_server_git-$v-"*.whl >/dev/null 2>&1; then
    "$venv/bin/python" -m pip download -q --disable-pip-version-check --cache-dir /var/cache/germline/pip-cache \
      --no-deps --only-binary=:all: -d "$wheels" "mcp-server-git==$v"
  fi
done
chmod -R a+rX "$real"
