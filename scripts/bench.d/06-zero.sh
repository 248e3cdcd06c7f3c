#!/usr/bin/env bash
# Chapters 06 (ZeRO-1) and 07 (ZeRO-2) against chapter 05 (DDP), in one run, as ratios:
#   - step time on the ToyModel (1024-1024-1024-256), 2 ranks, 64 samples per rank per step,
#     with the default buckets (25 MiB) and with 1 MiB buckets: ch06 / ch05 and ch07 / ch05
#     (goal <= 1.10: same traffic, the optimizer's work divided by N, plus an all-gather);
#   - peak model-state bytes per rank (the ledger's, largest over ranks), 1 MiB buckets:
#     ch07 / ch05 against the formulas' ratio (4Ψ + (4Ψ + 8Ψ)/N + two buckets in flight) / 16Ψ
#     (goal: within 5 %), and ch06 / ch05 against (4Ψ + 4Ψ + 8Ψ/N) / 16Ψ.
# Each configuration runs REPEATS times (default 3), interleaved, and the median of the runs'
# median step times is used.
#   BUILD=build-foo NP=4 REPEATS=5 scripts/bench.d/06-zero.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
NP=${NP:-2}
REPEATS=${REPEATS:-3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
chapters=(ch05_ddp_buckets ch06_zero1 ch07_zero2)
for b in "${chapters[@]}"; do
  [ -x "$BUILD/bin/$b" ] || { echo "skipped: $BUILD/bin/$b not built"; exit 0; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# run CHAPTER CAP: one run; prints "ms_per_step peak_model_states Ψ in_flight".
run() {
  mpirun -np "$NP" --oversubscribe "$BUILD/bin/$1" --model toy --epochs 1000 --max-steps 40 \
    --global-batch-size $((64 * NP)) --bucket-cap-mb "$2" --eval-every-epoch 0 --log-every 100000 \
    --metrics "$tmp/m.jsonl" >"$tmp/log" 2>&1 || { cat "$tmp/log"; exit 1; }
  python3 -c 'import json, sys
s = [json.loads(l) for l in open(sys.argv[1])][-1]
print(s["ms_per_step"], max(l["model_states_peak"] for l in s["ledger"]), s["num_parameters"],
      s.get("in_flight_peak_bytes", 0))' "$tmp/m.jsonl"
}
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

declare -A ms peak psi inflight
for ((i = 0; i < REPEATS; i++)); do
  for cap in 25 1; do
    for ch in "${chapters[@]}"; do
      read -r t p n f <<<"$(run "$ch" "$cap")"
      ms[$ch.$cap]+="$t "
      peak[$ch.$cap]=$p psi[$ch.$cap]=$n inflight[$ch.$cap]=$f
    done
  done
done

echo "ZeRO-1 / ZeRO-2 vs DDP, ToyModel, $NP ranks, 64 samples/rank/step: median ms/step over $REPEATS runs"
printf '  %-18s | %9s | %9s | %9s | %-11s | %s\n' buckets "ch05 ms" "ch06 ms" "ch07 ms" "ch06 / ch05" "ch07 / ch05 (goal <= 1.10 both)"
for cap in 25 1; do
  # shellcheck disable=SC2086
  a=$(median ${ms[ch05_ddp_buckets.$cap]}) b=$(median ${ms[ch06_zero1.$cap]}) c=$(median ${ms[ch07_zero2.$cap]})
  awk -v cap="$cap" -v a="$a" -v b="$b" -v c="$c" 'BEGIN {
    printf "  %-18s | %9.1f | %9.1f | %9.1f | %-11.2f | %.2f\n", "--bucket-cap-mb " cap, a, b, c, b / a, c / a }'
done

echo "peak model states per rank (ledger), 1 MiB buckets, N = $NP: measured vs formula"
python3 - "$NP" "${peak[ch05_ddp_buckets.1]}" "${peak[ch06_zero1.1]}" "${peak[ch07_zero2.1]}" \
  "${psi[ch05_ddp_buckets.1]}" "${inflight[ch07_zero2.1]}" <<'PY'
import sys
N, p5, p6, p7, psi, inflight = (int(x) for x in sys.argv[1:])
ddp = 16 * psi
f6 = (8 * psi + 8 * psi / N) / ddp
f7 = (4 * psi + 12 * psi / N + inflight) / ddp
print(f"  ch05 (DDP)    {p5 / 1e6:8.2f} MB   formula 16Ψ = {ddp / 1e6:.2f} MB")
for name, p, f, text in (("ch06 (ZeRO-1)", p6, f6, "4Ψ + 4Ψ + 8Ψ/N"),
                         ("ch07 (ZeRO-2)", p7, f7, f"4Ψ + 12Ψ/N + {inflight / 1e6:.2f} MB in flight")):
    dev = (p / p5) / f - 1
    print(f"  {name} {p / 1e6:8.2f} MB   / ch05 = {p / p5:.3f}; formula {text}: {f:.3f}; "
          f"deviation {100 * dev:+.2f} % {'(goal within 5 %: met)' if abs(dev) <= 0.05 else '(goal within 5 %: NOT met)'}")
PY
