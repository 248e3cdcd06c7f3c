#!/usr/bin/env bash
# The cost of --check-collectives (common/checks/collective_check.hpp): chapter 05 with and without
# it, step time side by side, as a ratio (goal: <= 1.05, cheap enough to be on in every test).
#   - the tour's setting (scripts/run): MLP on Fashion-MNIST, 4 ranks, 0.25 MiB buckets
#     (the most all-reduces per step, so the most checks: the worst case);
#   - ToyModel, 2 ranks, default buckets.
# Each configuration runs REPEATS times (default 3), interleaved; the median of the runs'
# median step times is used. Same losses either way (the check changes no number).
#   BUILD=build-foo REPEATS=5 scripts/bench.d/10-collective-check.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
REPEATS=${REPEATS:-3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset RINGZERO_CHECK_COLLECTIVES
[ -x "$BUILD/bin/ch05_ddp_buckets" ] || { echo "skipped: $BUILD/bin/ch05_ddp_buckets not built"; exit 0; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

declare -A args=(
  [mlp4]="-np 4 --oversubscribe $BUILD/bin/ch05_ddp_buckets --bucket-cap-mb 0.25 --max-steps 300"
  [toy2]="-np 2 $BUILD/bin/ch05_ddp_buckets --model toy --epochs 1000 --max-steps 60"
)
# ms CONFIG [FLAG]: one run's median ms per step (the summary's ms_per_step).
ms() {
  # shellcheck disable=SC2086
  mpirun ${args[$1]} ${2:-} --eval-every-epoch 0 --log-every 100000 --metrics "$tmp/m.jsonl" \
    >"$tmp/log" 2>&1 || { cat "$tmp/log"; exit 1; }
  python3 -c 'import json,sys; print([json.loads(l) for l in open(sys.argv[1])][-1]["ms_per_step"])' "$tmp/m.jsonl"
}
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
declare -A runs
for ((i = 0; i < REPEATS; i++)); do
  for c in mlp4 toy2; do
    runs[$c.off]+="$(ms $c) "
    runs[$c.on]+="$(ms $c --check-collectives) "
  done
done
echo "ch05 step time with --check-collectives vs without (median of $REPEATS runs)"
printf '  %-44s | %8s | %8s | %s\n' configuration "off ms" "on ms" "on / off"
for c in mlp4 toy2; do
  # shellcheck disable=SC2086
  off=$(median ${runs[$c.off]}) on=$(median ${runs[$c.on]})
  name=$([ $c = mlp4 ] && echo "MLP, 4 ranks, 0.25 MiB buckets (tour)" || echo "ToyModel, 2 ranks, 25 MiB buckets")
  printf '  %-44s | %8.2f | %8.2f | %s   (goal <= 1.05)\n' "$name" "$off" "$on" \
    "$(awk -v a="$off" -v b="$on" 'BEGIN {printf "%.3f", b / a}')"
done
