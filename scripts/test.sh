#!/usr/bin/env bash
# The test suite: installs what it needs, then runs every crate's tests.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
bash scripts/setup.sh
export GERMLINE_PYTHON="${GERMLINE_PYTHON:-$here/.venv/bin/python}"
# Reuse a build cache outside the clone when there is one (CI on a warm machine).
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/cache/germline/target}"
mkdir -p "$CARGO_TARGET_DIR"
cargo build --workspace --all-targets --locked
cargo test --workspace --locked -- --test-threads=2
