#!/usr/bin/env bash
# The test suite: installs what it needs, then runs every crate's tests.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
bash scripts/setup.sh
export GERMLINE_PYTHON="${GERMLINE_PYTHON:-$here/.venv/bin/python}"
# CPython 3.12/3.13, where setup made a venv of it (see setup.sh): immortal-heap germlines.
imm_python=/var/cache/germline/venv-immortal/bin/python
if [ -z "${GERMLINE_PYTHON_IMMORTAL:-}" ] && [ -x "$imm_python" ]; then
  export GERMLINE_PYTHON_IMMORTAL="$imm_python"
fi
# Reuse a build cache outside the clone when there is one (CI on a warm machine).
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/cache/germline/target}"
mkdir -p "$CARGO_TARGET_DIR"
cargo build --workspace --all-targets --locked
# A reused cache keeps the test binaries of every earlier commit (gigabytes each time a
# workspace crate changes): once the build is done, only the newest of each name is current.
find "$CARGO_TARGET_DIR/debug/deps" -maxdepth 1 -type f -perm -u+x -name '*-*' ! -name '*.*' -printf '%T@ %f\n' |
  sort -rn | awk '{ n = $2; sub(/-[0-9a-f]+$/, "", n); if (seen[n]++) print $2 }' |
  while read -r f; do rm -f "$CARGO_TARGET_DIR/debug/deps/$f" "$CARGO_TARGET_DIR/debug/deps/$f.d"; done
cargo test --workspace --locked -- --test-threads=2
# The security tests again with copies forked per call (the suite above ran them with the
# default pool of ready copies): every guarantee must hold both ways.
GERMLINE_POOL=0 cargo test --workspace --locked \
  --test executor_hostile --test executor_flows --test kernel_channels_fds --test kernel_channels_proc \
  --test kernel_channels_filter --test kernel_channels_root --test redteam_kernel --test redteam_kernel2 \
  --test copy_ids --test twin_clock --test eval_matrix -- --test-threads=2
# And on the interpreter with immortal objects, where there is one: the germline's heap is
# then immortal before every fork, and the same guarantees hold for its copies.
if [ -n "${GERMLINE_PYTHON_IMMORTAL:-}" ]; then
  GERMLINE_PYTHON="$GERMLINE_PYTHON_IMMORTAL" cargo test --workspace --locked \
    --test executor_hostile --test executor_flows --test kernel_channels_fds --test kernel_channels_proc \
    --test kernel_channels_filter --test kernel_channels_root --test copy_ids --test twin_clock --test pool \
    -- --test-threads=2
fi
# The security tests and the real-server corpus again with the default root (SECURITY.md,
# "Minimal root"): the suite above ran as root, so with a resident root (only what the release
# reads bound, every page of it locked in memory); a broker that is not root gets this one.
GERMLINE_RESIDENT_ROOT=0 cargo test --workspace --locked \
  --test executor_hostile --test executor_flows --test kernel_channels_fds --test kernel_channels_proc \
  --test kernel_channels_filter --test kernel_channels_root --test copy_ids --test twin_clock --test pool \
  --test real_servers --test pypi_compat -- --test-threads=2
