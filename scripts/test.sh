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
# The security tests again with copies forked per call (the suite above ran them with the
# default pool of ready copies): every guarantee must hold both ways.
GERMLINE_POOL=0 cargo test --workspace --locked \
  --test executor_hostile --test executor_flows --test kernel_channels_fds --test kernel_channels_proc \
  --test kernel_channels_filter --test kernel_channels_root --test redteam_kernel --test redteam_kernel2 \
  --test copy_ids --test twin_clock --test eval_matrix -- --test-threads=2
