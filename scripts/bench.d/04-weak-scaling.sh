#!/usr/bin/env bash
# Chapter 04 weak scaling: per-rank throughput at NP ranks (default 2) against one rank, with the
# same work per rank (64 samples per rank per step, so the global batch grows with the ranks).
# Per-rank throughput = (global batch / ranks) / median step time (the summary's ms_per_step,
# first step excluded). Goal: >= 0.85x of one rank's, for the ToyModel
# (1024-1024-1024-256, MSE, AdamW) and the Fashion-MNIST MLP (784-512-512-10).
# Each configuration runs REPEATS times (default 3), interleaved; the median of the runs'
# median step times is used. On fewer cores than ranks this measures the oversubscription,
# not the ring: run it where every rank has its own core.
#   BUILD=build-foo NP=4 STEPS=60 scripts/bench.d/04-weak-scaling.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
NP=${NP:-2}
STEPS=${STEPS:-40}
REPEATS=${REPEATS:-3}
CH04="$BUILD/bin/ch04_ring_allreduce"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ -x "$CH04" ] || { echo "skipped: $CH04 not built (scripts/bench builds it)"; exit 0; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
echo "cores: $(nproc), ranks: $NP"

ms_per_step() {  # FILE.jsonl -> the summary's ms_per_step
  python3 -c 'import json,sys; print([json.loads(l) for l in open(sys.argv[1]) if "\"summary\"" in l][-1]["ms_per_step"])' "$1"
}
median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

for model in toy mlp; do
  args=(--model "$model" --max-steps "$STEPS" --eval-every-epoch 0 --log-every 100000)
  for i in $(seq "$REPEATS"); do
    mpirun -np 1 "$CH04" "${args[@]}" --global-batch-size 64 --metrics "$TMP/one.jsonl" >/dev/null
    ms_per_step "$TMP/one.jsonl" >>"$TMP/$model.one"
    mpirun -np "$NP" --oversubscribe "$CH04" "${args[@]}" --global-batch-size $((64 * NP)) \
      --metrics "$TMP/many.jsonl" >/dev/null
    ms_per_step "$TMP/many.jsonl" >>"$TMP/$model.many"
  done
  one=$(median <"$TMP/$model.one")
  many=$(median <"$TMP/$model.many")
  awk -v m="$model" -v one="$one" -v many="$many" -v np="$NP" 'BEGIN {
    r = one / many  # per-rank samples/s ratio: 64/many over 64/one
    printf "%-4s 1 rank: %7.2f ms/step (%6.0f samples/s) | %d ranks: %7.2f ms/step (%6.0f samples/s per rank) | per-rank ratio %.2f -> goal >= 0.85 %s\n",
      m, one, 64000 / one, np, many, 64000 / many, r, (r >= 0.85 ? "MET" : "NOT MET")
  }'
done
