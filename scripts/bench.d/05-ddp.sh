#!/usr/bin/env bash
# Chapter 05 against chapter 04 and against PyTorch DDP, step time side by side, as ratios.
#   - ToyModel (1024-1024-1024-256, 6 parameter tensors) and an MLP with 25 Linear layers (50
#     parameter tensors, --hidden-sizes 256 x 24), 2 ranks, 64 samples per rank per step (the
#     peer's batch): ch05 / ch04 (goal on the 50-tensor model: <= 0.9);
#   - ToyModel, 2 ranks: ch05 / PyTorch DDP over gloo (bench/peers/torch_toymodel.py
#     --world 2; goal <= 0.75). Skipped, with a notice, where PyTorch is not installed.
# Each configuration runs REPEATS times (default 3), interleaved, and the median of the runs'
# median step times is used; all ratios come from this one invocation.
#   BUILD=build-foo NP=4 scripts/bench.d/05-ddp.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
NP=${NP:-2}
REPEATS=${REPEATS:-3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for b in ch04_ring_allreduce ch05_ddp_buckets; do
  [ -x "$BUILD/bin/$b" ] || { echo "skipped: $BUILD/bin/$b not built"; exit 0; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

deep=$(printf '256,%.0s' {1..24}); deep=${deep%,}
declare -A args=(
  [toy]="--model toy --epochs 1000 --max-steps 40"
  [deep]="--model mlp --hidden-sizes $deep --max-steps 40"
)
# ms CHAPTER MODEL: one run's median ms per step (the summary's ms_per_step).
ms() {
  # shellcheck disable=SC2086
  mpirun -np "$NP" --oversubscribe "$BUILD/bin/$1" ${args[$2]} --global-batch-size $((64 * NP)) \
    --eval-every-epoch 0 --log-every 100000 --metrics "$tmp/m.jsonl" >"$tmp/log" 2>&1 || { cat "$tmp/log"; exit 1; }
  python3 -c 'import json,sys; print([json.loads(l) for l in open(sys.argv[1])][-1]["ms_per_step"])' "$tmp/m.jsonl"
}
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", b / a}'; }

declare -A runs
for ((i = 0; i < REPEATS; i++)); do
  for model in toy deep; do
    for ch in ch04_ring_allreduce ch05_ddp_buckets; do runs[$ch.$model]+="$(ms $ch $model) "; done
  done
done
declare -A med
for key in "${!runs[@]}"; do
  # shellcheck disable=SC2086
  med[$key]=$(median ${runs[$key]})
done

echo "ch05 (DDP buckets, overlapped) vs ch04 (ring per parameter, after backward), $NP ranks, 64 samples/rank/step"
printf '  %-34s | %10s | %10s | %s\n' model "ch04 ms" "ch05 ms" "ch05 / ch04"
for model in toy deep; do
  name=$([ $model = toy ] && echo "ToyModel (6 tensors)" || echo "MLP 25 layers (50 tensors)")
  a=${med[ch04_ring_allreduce.$model]} b=${med[ch05_ddp_buckets.$model]}
  printf '  %-34s | %10.1f | %10.1f | %s%s\n' "$name" "$a" "$b" "$(ratio "$a" "$b")" \
    "$([ $model = deep ] && echo '   (goal <= 0.90)')"
done

if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  torch_runs=""
  for ((i = 0; i < REPEATS; i++)); do
    out=$(/usr/bin/python3 bench/peers/torch_toymodel.py --world "$NP" --steps 40 2>&1)
    torch_runs+="$(echo "$out" | sed -n 's/.*median_step_ms=\([0-9.]*\).*/\1/p') "
  done
  # shellcheck disable=SC2086
  t=$(median $torch_runs)
  b=${med[ch05_ddp_buckets.toy]}
  echo "ch05 vs PyTorch DDP (gloo, bucket_cap_mb=25), ToyModel, $NP ranks, 64 samples/rank/step"
  printf '  PyTorch %.1f ms | ch05 %.1f ms | ch05 / PyTorch %s   (goal <= 0.75)\n' "$t" "$b" "$(ratio "$t" "$b")"
else
  echo "PyTorch DDP comparison skipped: /usr/bin/python3 cannot import torch (Debian: python3-torch libopenblas0-pthread)"
fi
