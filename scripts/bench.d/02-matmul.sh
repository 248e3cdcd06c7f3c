#!/usr/bin/env bash
# The library's matmul against raw Eigen: GFLOP/s of linear_forward / linear_backward and of
# the bare Eigen GEMMs on the same shapes (the ToyModel's and the MLP's layers, batch 64), one
# thread, with the overhead of ours over raw Eigen (goal: <= 10 %). See tests/tools/bench_matmul.cpp.
#   BUILD=build-debug scripts/bench.d/02-matmul.sh     another build directory (default: build)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
tool="$BUILD/tests/bench_matmul"
if [ ! -x "$tool" ]; then
  echo "skipped: $tool not built (configure with -DBUILD_TESTING=ON; scripts/bench does)"; exit 0
fi
"$tool" --seconds "${SECONDS_PER_SHAPE:-2}"
