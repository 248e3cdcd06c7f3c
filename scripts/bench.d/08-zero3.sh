#!/usr/bin/env bash
# Chapter 08 (ZeRO-3) against chapter 07 (ZeRO-2) and chapter 05 (DDP), in one run, as ratios:
#   - step time on the ToyModel (1024-1024-1024-256), 2 ranks, 64 samples per rank per step:
#     ch08 / ch07 with prefetch (goal <= 1.3: 1.5x the bytes, the gathers hidden behind
#     compute) and with --no-prefetch (every collective waited for: what prefetch buys);
#   - bytes sent per rank per step, ch08 / ch07 (theory: 3(N-1)/N / 2(N-1)/N = 1.5);
#   - peak model-state bytes per rank (the ledger's, largest over ranks): ch05 / ch08 against
#     N (goal: within 5 %). ZeRO-3's full layers in flight are the collectives' buffers
#     (comm_buffers), not model states: they are printed apart, beside their formula.
# Each configuration runs REPEATS times (default 3), interleaved, and the median of the runs'
# median step times is used.
#   BUILD=build-foo NP=4 REPEATS=5 scripts/bench.d/08-zero3.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
NP=${NP:-2}
REPEATS=${REPEATS:-3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for b in ch05_ddp_buckets ch07_zero2 ch08_zero3; do
  [ -x "$BUILD/bin/$b" ] || { echo "skipped: $BUILD/bin/$b not built"; exit 0; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# run NAME BINARY ARGS...: one run; prints "ms_per_step peak_model_states sent_per_step
# layers_in_flight peak_comm_buffers".
run() {
  local bin=$2; shift 2
  mpirun -np "$NP" --oversubscribe "$BUILD/bin/$bin" --model toy --epochs 1000 --max-steps 40 \
    --global-batch-size $((64 * NP)) --eval-every-epoch 0 --log-every 100000 --metrics "$tmp/m.jsonl" "$@" \
    >"$tmp/log" 2>&1 || { cat "$tmp/log"; exit 1; }
  python3 -c 'import json, sys
s = [json.loads(l) for l in open(sys.argv[1])][-1]
print(s["ms_per_step"], max(l["model_states_peak"] for l in s["ledger"]), s["bytes_sent_per_rank_per_step"],
      s.get("in_flight_peak_bytes", 0), max(l["comm_buffers"]["peak"] for l in s["ledger"]))' "$tmp/m.jsonl"
}
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

declare -A ms peak sent inflight buffers
for ((i = 0; i < REPEATS; i++)); do
  for cfg in ch05 ch07 ch08 ch08_noprefetch; do
    case $cfg in
      ch05) out=$(run "$cfg" ch05_ddp_buckets) ;;
      ch07) out=$(run "$cfg" ch07_zero2) ;;
      ch08) out=$(run "$cfg" ch08_zero3) ;;
      ch08_noprefetch) out=$(run "$cfg" ch08_zero3 --no-prefetch) ;;
    esac
    read -r t p s f c <<<"$out"
    ms[$cfg]+="$t "
    peak[$cfg]=$p sent[$cfg]=$s inflight[$cfg]=$f buffers[$cfg]=$c
  done
done

# shellcheck disable=SC2086
t5=$(median ${ms[ch05]}) t7=$(median ${ms[ch07]}) t8=$(median ${ms[ch08]}) t8n=$(median ${ms[ch08_noprefetch]})
echo "ZeRO-3 vs ZeRO-2, ToyModel, $NP ranks, 64 samples/rank/step: median ms/step over $REPEATS runs"
awk -v a="$t5" -v b="$t7" -v c="$t8" -v d="$t8n" 'BEGIN {
  printf "  ch05 %.1f ms | ch07 %.1f ms | ch08 prefetch %.1f ms | ch08 --no-prefetch %.1f ms\n", a, b, c, d
  printf "  ch08 / ch07 with prefetch: %.2f (goal <= 1.3: %s); without: %.2f; prefetch saves %.0f %%\n",
         c / b, (c / b <= 1.3 ? "met" : "NOT met"), d / b, 100 * (1 - c / d) }'
python3 - "$NP" "${sent[ch07]}" "${sent[ch08]}" "${peak[ch05]}" "${peak[ch08]}" "${inflight[ch08]}" \
  "${inflight[ch08_noprefetch]}" "${buffers[ch08]}" "${buffers[ch08_noprefetch]}" <<'PY'
import sys
N = int(sys.argv[1])
s7, s8, p5, p8, f8, f8n, b8, b8n = (float(x) for x in sys.argv[2:])
if s7 > 0:
    print(f"  bytes sent per rank per step: ch07 {s7 / 1e6:.2f} MB, ch08 {s8 / 1e6:.2f} MB: {s8 / s7:.3f}x "
          f"(theory 1.5x, plus 16-byte desync headers)")
dev = (p5 / p8) / N - 1
print(f"  peak model states per rank: ch05 {p5 / 1e6:.2f} MB, ch08 {p8 / 1e6:.2f} MB: ch05 / ch08 = {p5 / p8:.3f}, "
      f"N = {N}: deviation {100 * dev:+.2f} % ({'goal within 5 %: met' if abs(dev) <= 0.05 else 'goal within 5 %: NOT met'})")
print(f"  ch08 full layers in flight (comm_buffers, not model states): prefetch {f8 / 1e6:.2f} MB "
      f"(4·max(P_l-1 + 2P_l + P_l+1)), --no-prefetch {f8n / 1e6:.2f} MB (8·max P_l); "
      f"comm_buffers peak {b8 / 1e6:.2f} / {b8n / 1e6:.2f} MB with the ring's chunk")
PY
