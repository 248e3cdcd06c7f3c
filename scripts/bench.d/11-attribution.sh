#!/usr/bin/env bash
# Step-time attribution (--attribute, docs/attribution.md), measured: CHAPTERS (default 03-08) at N ranks
# (default 3; global batch 24 N), each run clean and with planted causes, REPEATS times (default 5), 30 steps of the
# Fashion-MNIST MLP (synthetic data where the dataset is missing):
#   - clean: rank 0's mean ms per step per part, and the parts' sum against the step the driver
#     measured (rank 0's step records, the first step left out as the account does);
#   - straggler (--delay-rank 1:DELAY_MS, default 100): in how many runs rank 1 was named, and
#     how much longer the others waited than it did;
#   - planted causes, each against the clean run (mean over ranks): which part grew the most,
#     by how much, and whether it names the cause (one of the parts docs/attribution.md says the
#     cause should grow; the count of those named is printed last): tiny buckets (--bucket-cap-mb
#     TINY_MB, default 0.01, chapters 05-07), overlap off (--no-overlap, 05-08), oversubscribed
#     cores (every rank on core 0: taskset -c 0, 03-08; on the cluster, below, HOGS busy
#     processes on the nodes' compute core).
#     Accumulation without no_sync (05 only; no flag plants it, it is a change to the chapter): a
#     copy of the source as the working tree has it (tracked files with their uncommitted edits,
#     and untracked ones git does not ignore) in $TMP/nosync-src, chapter 05 built there
#     (Release, as the release preset; JOBS, default 2, through ccache where installed), then
#     scripts/bench.d/no_sync.patch applied and chapter 05 rebuilt: both binaries from one copy,
#     so the patch is the only difference. Both run at --grad-accum-steps GRAD_ACCUM_STEPS
#     (default 4), the planted one against that clean one; also printed, and checked: the final
#     losses (the same but for rounding) and bytes per step per rank (exactly K times).
#     A slow link (ON_CLUSTER=1 only): node 1's link at SLOW_RATE (default 250mbit) both ways
#     (scripts/cluster shape), restored after each run.
# ONLY="clean slow": only these runs (the tables skip what was not run; clean is every
# cause's reference). CHAPTERS="05_ddp_buckets": only these chapters.
# ON_CLUSTER=1: across the nodes of `scripts/cluster up` instead (N: the cluster's ranks; the
# scripts/cluster-tour model, four hidden layers of 512, global batch 256 N, STEPS (default 20)).
# There the nodes share the compute cores, so a sleeping rank lends its share to the others: a
# delay shorter than their compute is absorbed, not waited for (docs/attribution.md); give
# DELAY_MS=200. `scripts/cluster run` places the ranks itself, so oversubscribed cores are
# planted beside them: HOGS (default: one per rank) busy processes pinned to the nodes' compute
# cores for the run, each node's core shared with one more runnable process. A bucket holds at
# least one parameter and that MLP has 10, so tiny buckets run on a model of many small
# parameters, TINY_HIDDEN (default 32 hidden layers of 128: 66 parameters), against a clean run
# of that model (tinyref); with a core for communication (--comm-core), TINY_MB=0.002 makes
# their per-message latency show.
# Prints Markdown tables (docs/attribution.md shows the last measured run). Wall-clock figures:
# run on a quiet machine; never part of the tests.
#   N=4 REPEATS=20 DELAY_MS=50 scripts/bench.d/11-attribution.sh
#   scripts/cluster up --nodes 4 --slots 1 --bandwidth 1gbit --comm-core &&
#     ON_CLUSTER=1 REPEATS=4 DELAY_MS=200 TINY_MB=0.002 scripts/bench.d/11-attribution.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
[ -x "$BUILD/bin/ch05_ddp_buckets" ] || { echo "skipped: $BUILD/bin not built"; exit 0; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
N=${N:-3} REPEATS=${REPEATS:-5} DELAY_MS=${DELAY_MS:-100} TINY_MB=${TINY_MB:-0.01}
SLOW_RATE=${SLOW_RATE:-250mbit} GRAD_ACCUM_STEPS=${GRAD_ACCUM_STEPS:-4}
ONLY=${ONLY:-clean late oversubscribed tiny serial slow nosync}  # which runs (clean: needed by every table)
read -ra chapters <<<"${CHAPTERS:-03_data_parallel 04_ring_allreduce 05_ddp_buckets 06_zero1 07_zero2 08_zero3}"
want() { [[ " $ONLY " == *" $1 "* ]]; }
want clean || { echo "ONLY=\"$ONLY\": add clean, the first table and every cause's reference" >&2; exit 1; }
data=()
[ -d /usr/share/datasets/fashion-mnist ] && data=(--data fashion-mnist)
common=(--model mlp "${data[@]}" --global-batch-size $((24 * N)) --max-steps 30 --eval-every-epoch 0 --log-every 1000 --attribute)
model=()  # the MLP's hidden layers: the chapters' default here, the tour's on the cluster
launch=(mpirun -np "$N" --oversubscribe --bind-to none)
if [ "${ON_CLUSTER:-0}" = 1 ]; then
  state=/run/ringzero-cluster/${CLUSTER:-rz}/config
  [ -f "$state" ] || { echo "ON_CLUSTER=1: no cluster is up; scripts/cluster up --nodes 4 --slots 1 --bandwidth 1gbit --comm-core" >&2; exit 1; }
  N=$(( $(sed -n 's/^nodes=//p' "$state") * $(sed -n 's/^slots=//p' "$state") ))
  model=(--hidden-sizes 512,512,512,512)
  common=(--model mlp "${data[@]}" --global-batch-size $((256 * N))
          --max-steps "${STEPS:-20}" --eval-every-epoch 0 --log-every 1000 --attribute)
  launch=(scripts/cluster run --)
  compute_cpus=$(sed -n 's/^compute_cpus=//p' "$state")
  HOGS=${HOGS:-$N}
  TINY_HIDDEN=${TINY_HIDDEN:-$(printf '128,%.0s' $(seq 31))128}
  # never leave a link slow, nor a busy process behind
  trap 'stop_hogs; scripts/cluster shape 1 up >/dev/null || true; rm -rf "$TMP"' EXIT
fi
hogs=()
start_hogs() {  # HOGS busy processes on the nodes' compute cores (all cores without --comm-core)
  local cpus=${compute_cpus:-0-$(($(nproc) - 1))}
  for _ in $(seq "$HOGS"); do taskset -c "$cpus" sh -c 'while :; do :; done' & hogs+=($!); done
}
stop_hogs() {
  [ ${#hogs[@]} -eq 0 ] || { kill "${hogs[@]}" 2>/dev/null || true; wait "${hogs[@]}" 2>/dev/null || true; hogs=(); }
}

run() {  # run TAG CHAPTER ARGS... (PIN=CPUS: every rank on those cores; BINDIR: the chapter's;
         # MODEL: the hidden layers, else the run's model)
  local tag=$1 ch=$2; shift 2
  local pin=() hidden=("${model[@]}")
  [ -n "${PIN:-}" ] && pin=(taskset -c "$PIN")
  [ -n "${MODEL:-}" ] && hidden=(--hidden-sizes "$MODEL")
  # In the background and waited for: timeout gives the run its own process group, which a
  # Ctrl-C at the terminal does not reach, and bash runs a trap only once a foreground command
  # ends; `wait` returns at the signal, and stop_run ends the run.
  timeout 600 "${pin[@]}" "${launch[@]}" "${BINDIR:-$BUILD/bin}/ch$ch" "${common[@]}" "${hidden[@]}" "$@" \
    --metrics "$TMP/$tag.jsonl" >"$TMP/$tag.log" 2>&1 &
  current_run=$!
  wait "$current_run" || { echo "FAILED: $tag"; cat "$TMP/$tag.log"; exit 1; }
  current_run=
}
current_run=
stop_run() {  # timeout passes the TERM on to the run's whole process group (mpirun, the ranks)
  [ -z "$current_run" ] || { echo "interrupted: stopping the current run" >&2
    kill -TERM "$current_run" 2>/dev/null || true; wait "$current_run" 2>/dev/null || true; }
  current_run=
}
trap 'stop_run; exit 130' INT TERM HUP QUIT

# Accumulation without no_sync: chapter 05 clean and planted, built in one copy of the source
# ($TMP/nosync/clean and planted), never touching the repository's chapter.
plant_nosync() {
  local src=$TMP/nosync-src log=$TMP/nosync-build.log launcher=()
  command -v git >/dev/null || { echo "FAILED: nosync needs git (git apply plants the patch); install git or leave nosync out of ONLY" >&2; exit 1; }
  mkdir -p "$src" "$TMP/nosync/clean" "$TMP/nosync/planted"
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then  # a file deleted but not yet from git: left out
    git ls-files -z --cached --others --exclude-standard | tar --null -T - --ignore-failed-read -cf - |
      tar -xf - -C "$src"
  else
    tar --exclude=./build --exclude='./build-*' -cf - . | tar -xf - -C "$src"
  fi
  # Before minutes of building: the patch must apply to chapter 05 as this tree has it.
  GIT_CEILING_DIRECTORIES=$TMP git -C "$src" apply --check scripts/bench.d/no_sync.patch || {
    echo "FAILED: scripts/bench.d/no_sync.patch does not apply to chapters/05_ddp_buckets/step.hpp as this tree has it: undo uncommitted edits there (a bug hunt: scripts/exercise reset ID), or leave nosync out of ONLY" >&2
    exit 1; }
  # ccache's paths relative to the copy, so that the next bench's copy (another $TMP) hits.
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$src}
  echo "accumulation without no_sync: building chapter 05 clean and planted in $src (minutes)" >&2
  build_ch05() {  # build_ch05 clean|planted
    cmake --build "$src/build" -j"${JOBS:-2}" --target ch05_ddp_buckets >>"$log" 2>&1 &&
      cp "$src/build/bin/ch05_ddp_buckets" "$TMP/nosync/$1/"
  }
  { cmake -S "$src" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF \
      "${launcher[@]}" >"$log" 2>&1 && build_ch05 clean &&
      GIT_CEILING_DIRECTORIES=$TMP git -C "$src" apply scripts/bench.d/no_sync.patch >>"$log" 2>&1 &&
      build_ch05 planted; } || { tail -30 "$log"; echo "FAILED: planting no_sync (log above)"; exit 1; }
}
if want nosync && [[ " ${chapters[*]} " == *" 05_ddp_buckets "* ]]; then plant_nosync; fi

for ch in "${chapters[@]}"; do
  for r in $(seq "$REPEATS"); do
    want clean && run "clean_${ch}_$r" "$ch"
    want late && run "late_${ch}_$r" "$ch" --delay-rank "1:$DELAY_MS"
    if want oversubscribed; then
      if [ "${ON_CLUSTER:-0}" != 1 ]; then PIN=0 run "oversubscribed_${ch}_$r" "$ch"
      else start_hogs; run "oversubscribed_${ch}_$r" "$ch"; stop_hogs; fi
    fi
    if want tiny; then
      case $ch in 05_* | 06_* | 07_*)
        if [ -n "${TINY_HIDDEN:-}" ]; then  # its own reference: a clean run of that model
          MODEL=$TINY_HIDDEN run "tinyref_${ch}_$r" "$ch"
          MODEL=$TINY_HIDDEN run "tiny_${ch}_$r" "$ch" --bucket-cap-mb "$TINY_MB"
        else
          run "tiny_${ch}_$r" "$ch" --bucket-cap-mb "$TINY_MB"
        fi ;;
      esac
    fi
    if want serial; then
      case $ch in 05_* | 06_* | 07_* | 08_*) run "serial_${ch}_$r" "$ch" --no-overlap ;; esac
    fi
    if want nosync && [ "$ch" = 05_ddp_buckets ]; then  # both at the same K
      BINDIR=$TMP/nosync/clean run "nosyncref_${ch}_$r" "$ch" --grad-accum-steps "$GRAD_ACCUM_STEPS"
      BINDIR=$TMP/nosync/planted run "nosync_${ch}_$r" "$ch" --grad-accum-steps "$GRAD_ACCUM_STEPS"
    fi
    if want slow && [ "${ON_CLUSTER:-0}" = 1 ]; then  # node 1's link at SLOW_RATE, both ways
      scripts/cluster shape 1 "$SLOW_RATE" >/dev/null
      run "slow_${ch}_$r" "$ch"
      scripts/cluster shape 1 up >/dev/null
    fi
  done
done

python3 - "$TMP" "$N" "$REPEATS" "$DELAY_MS" "$GRAD_ACCUM_STEPS" "${ON_CLUSTER:-0}" "${chapters[@]}" <<'PY'
import json, os, sys
tmp, N, R, delay, K = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
on_cluster, chapters = sys.argv[6] == "1", sys.argv[7:]
parts = ("forward", "backward", "optimizer", "communication", "peer_wait", "copies", "other")
def load(tag):
    lines = [json.loads(l) for l in open(f"{tmp}/{tag}.jsonl")]
    steps = [l["ms_per_step"] for l in lines if l["type"] == "step"][1:]
    return lines[-1]["attribution"], sum(steps) / len(steps)
def mean(xs): return sum(xs) / len(xs)
def over_ranks(a, p): return mean([r[p + "_ms"] for r in a["ranks"]])
print(f"Clean runs, N = {N}, mean of {R} runs, rank 0 (ms per step):\n")
print("| chapter | " + " | ".join(parts) + " | sum of parts | measured step | sum / measured |")
print("|---|" + "---:|" * (len(parts) + 3))
for ch in chapters:
    runs = [load(f"clean_{ch}_{r}") for r in range(1, R + 1)]
    row = [mean([a["ranks"][0][p + "_ms"] for a, _ in runs]) for p in parts]
    total, measured = mean([a["ranks"][0]["step_ms"] for a, _ in runs]), mean([m for _, m in runs])
    print(f"| {ch} | " + " | ".join(f"{x:.2f}" for x in row) +
          f" | {total:.2f} | {measured:.2f} | {total / measured:.3f} |")
late_chapters = [c for c in chapters if os.path.exists(f"{tmp}/late_{c}_1.jsonl")]
if late_chapters:
    print(f"\nPlanted straggler (--delay-rank 1:{delay}), N = {N}, {R} runs each:\n")
    print("| chapter | rank 1 named | others' extra wait, ms per step (min-max) |")
    print("|---|---:|---|")
for ch in late_chapters:
    late = [load(f"late_{ch}_{r}")[0] for r in range(1, R + 1)]
    named = sum(1 for a in late if a["late_rank"] == 1)
    waits = [a["late_by_ms"] for a in late]
    print(f"| {ch} | {named}/{R} | {min(waits):.1f}-{max(waits):.1f} |")
# Tiny buckets on a model of their own (TINY_HIDDEN) are measured against that model's clean runs.
tiny_ref = "tinyref" if any(os.path.exists(f"{tmp}/tinyref_{c}_1.jsonl") for c in chapters) else "clean"
crowded = "busy processes on the compute core" if on_cluster else "all ranks on one core"
# Each cause, its reference, and the parts that name it when one of them grew most
# (docs/attribution.md, "Planting a cause": what should grow).
compute_or_wait = {"forward", "backward", "optimizer", "peer_wait"}  # a descheduled rank, its peers
causes = (("tiny", "tiny buckets" + (" (many parameters)" if tiny_ref == "tinyref" else ""), tiny_ref,
           {"communication", "peer_wait"}),
          ("serial", "overlap off", "clean", {"communication"}),
          ("oversubscribed", crowded, "clean", compute_or_wait),
          ("slow", "a slow link (node 1)", "clean", {"communication", "peer_wait"}),
          ("nosync", "accumulation without no_sync", "nosyncref", {"communication"}))  # ref: clean at its K
print(f"\nPlanted causes against clean, N = {N}, mean over ranks and {R} runs:\n")
print("| cause | chapter | part grown most | named | clean ms | with the cause ms | step clean -> with |")
print("|---|---|---|---|---:|---:|---|")
named = []
for tag, cause, ref, expected in causes:
    for ch in [c for c in chapters if os.path.exists(f"{tmp}/{tag}_{c}_1.jsonl")]:
        runs = {t: [load(f"{t}_{ch}_{r}")[0] for r in range(1, R + 1)] for t in (ref, tag)}
        c, t = ({p: mean([over_ranks(a, p) for a in runs[k]]) for p in parts} for k in (ref, tag))
        top = max(parts, key=lambda p: t[p] - c[p])
        named.append(top in expected)
        print(f"| {cause} | {ch} | {top} | {'yes' if top in expected else 'no'} | {c[top]:.2f} | "
              f"{t[top]:.2f} | {sum(c.values()):.1f} -> {sum(t.values()):.1f} |")
if named:
    print(f"\nNamed (the part grown most is one the cause should grow): {sum(named)} of {len(named)}.")
if os.path.exists(f"{tmp}/nosync_05_ddp_buckets_1.jsonl"):
    # The plant must change what is sent, not what is learnt: every rank's bytes per step exactly
    # K times (K all-reduces of the same buckets), the losses the same but for rounding (a sum of
    # K means instead of the mean of one sum: float additions in another order).
    def losses(tag): return [l["loss"] for l in map(json.loads, open(f"{tmp}/{tag}.jsonl")) if l["type"] == "step"]
    def sent(tag):
        s = [json.loads(l) for l in open(f"{tmp}/{tag}.jsonl") if '"summary"' in l][-1]
        return [c["training"]["bytes_sent"] // s["steps"] for c in s["comm"]]
    ref, planted = "nosyncref_05_ddp_buckets", "nosync_05_ddp_buckets"
    worst = max(abs(p - c) / abs(c) for r in range(1, R + 1)
                for c, p in zip(losses(f"{ref}_{r}"), losses(f"{planted}_{r}")))
    b_ref, b_planted = sent(f"{ref}_1"), sent(f"{planted}_1")
    times = ("exactly K times on every rank" if all(
        sent(f"{planted}_{r}") == [K * b for b in sent(f"{ref}_{r}")] for r in range(1, R + 1))
        else "NOT K times")
    print(f"\nAccumulation without no_sync (chapter 05, --grad-accum-steps {K}, against a clean run "
          f"at the same K, both built from one copy of the source): final loss clean "
          f"{losses(ref + '_1')[-1]:.9f}, planted {losses(planted + '_1')[-1]:.9f} (largest relative "
          f"difference over every step of the {R} runs: {worst:.1e}); bytes sent per step per rank, "
          f"clean {b_ref}, planted {b_planted} (run 1): {times} in all {R} runs.")
    if not times.startswith("exactly"):
        sys.exit("FAILED: the planted chapter does not send K times the bytes per step")
PY
