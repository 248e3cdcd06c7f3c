#!/usr/bin/env bash
# Runs one libFuzzer target for a bounded time from its committed seed corpus:
#   tests/fuzz/run.sh FUZZ_BINARY SEED_DIR SECONDS
# New inputs go to a temporary directory (removed afterwards); the seed corpus is only read.
# Exit 0: no finding. A finding (crash, sanitizer report, leak, over-limit allocation, an
# exception other than ringzero::Error) exits non-zero and leaves the reproducer crash-*/
# leak-*/oom-* file in the test's working directory, named in the output.
set -euo pipefail
bin=$1 seeds=$2 seconds=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# -malloc_limit_mb: any single allocation over 256 MB is a finding (the parsers must never
# allocate what a header claims); -rss_limit_mb bounds the whole process.
"$bin" -max_total_time="$seconds" -rss_limit_mb=1024 -malloc_limit_mb=256 -timeout=10 \
  -print_final_stats=1 "$work" "$seeds"
