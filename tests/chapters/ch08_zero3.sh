#!/usr/bin/env bash
# Chapter 08's own claims, end to end:
#  - --explain-layers prints the per-layer plan (padding to a multiple of N, shard sizes);
#  - memory: every rank's model states peak at exactly 4Σs + 4Σs + 8·(real shard) (the
#    formula (4 + 4 + 8)Ψ/N plus padding), and comm_buffers peak at the ring's chunk plus the
#    full layers in flight, 4·max(P_l-1 + 2P_l + P_l+1) with prefetch, 8·max P_l without;
#  - traffic: bytes sent per rank per step equal the exact theory (two all-gathers and one
#    reduce-scatter per layer and micro-step, plus 16-byte desync headers), with evaluation
#    on (its gathers are not counted as training); about 1.5x chapter 07's; K times with K
#    micro-steps; --collectives mpi trains as close as rounding allows (MPI_Reduce_scatter_block
#    sums in its own order): `close` in lib.bash (SGD: relative L2 1e-4 of the movement,
#    losses within 1e-6; AdamW: Adam's own bound, 1.2e-2 after 6 steps); measured at N = 3 on
#    an AMD EPYC without AVX-512: SGD relative 3.2e-6, losses equal; AdamW 3.1e-7);
#  - --trace: per step and layer, the all-gather of the next layer (forward) and of the
#    previous one (backward) is posted before this layer's compute ends;
#  - desync: a rank that runs a layer once more (bin/zero3_desync: chapter 08 plus that fault)
#    stops every rank within seconds with a message naming the layers and the collective
#    number, at N = 2, 3, 4, instead of hanging in a mismatched collective.
source "$(dirname "$0")/lib.bash"
common=(--model mlp --global-batch-size 48 --max-steps 6 --epochs 1 --seed 3)

run explain 3 ch08_zero3 "${common[@]}" --eval-every-epoch 0 --explain-layers
grep -Eq "layer 0 +\| +401920 elements \| padding +2 \| shard +133974 elements" "$WORK/explain.log"
grep -Eq "layer 2 +\| +262656 elements \| padding +0 \| shard +87552 elements" "$WORK/explain.log"
grep -Eq "layer 4 +\| +5130 elements \| padding +0 \| shard +1710 elements" "$WORK/explain.log"
echo "ok: --explain-layers"

# summary A.jsonl B.jsonl ARG CODE: runs python CODE on the summary records s (of A) and r7
# (of B); ARG is sys.argv[3].
summary() {
  python3 - "$@" <<'EOF'
import json, sys
def last(name):
    with open(name) as f:
        return [json.loads(l) for l in f if '"summary"' in l][-1]
s, r7 = last(sys.argv[1]), last(sys.argv[2])
exec(sys.argv[4])
EOF
}
for np in 1 2 3 4; do
  run ch07_n$np $np ch07_zero2 "${common[@]}" --eval-every-epoch 0
  for prefetch in on off; do
    flags=(); [ $prefetch = off ] && flags=(--no-prefetch)
    run ch08_n${np}_$prefetch $np ch08_zero3 "${common[@]}" --eval-every-epoch 1 "${flags[@]}"
    summary "$WORK/ch08_n${np}_$prefetch.jsonl" "$WORK/ch07_n$np.jsonl" $prefetch '
N, psi = s["world_size"], s["num_parameters"]
assert s["zero_stage"] == 3 and s["prefetch"] == (sys.argv[3] == "on")
assert s["test_accuracy"] > 0, "evaluation ran"
exact = s["model_states_exact_bytes"]
for r, led in enumerate(s["ledger"]):
    assert led["model_states_peak"] == exact[r], (r, led["model_states_peak"], exact[r])
    cb = led["comm_buffers"]  # at the report only the ring chunk is left
    assert cb["peak"] == cb["current"] + s["in_flight_peak_bytes"], (r, cb, s["in_flight_peak_bytes"])
assert s["model_states_bytes_per_rank"] == max(exact)
assert abs(max(exact) - 16 * psi / N) <= 16 * 3, (exact, 16 * psi / N)  # padding: < N elements per layer
theory = s["theory_bytes_sent_per_rank_per_step"]
assert s["bytes_sent_per_rank_per_step"] == max(theory), (s["bytes_sent_per_rank_per_step"], theory)
for c in s["comm"]:
    assert c["training"]["bytes_sent"] == s["steps"] * theory[c["rank"]], c["training"]
if N > 1:
    ratio = s["bytes_sent_per_rank_per_step"] / r7["bytes_sent_per_rank_per_step"]
    assert abs(ratio - 1.5) < 0.005, ratio
sent = s["bytes_sent_per_rank_per_step"]
print(f"ok: N = {N}, prefetch {sys.argv[3]}: model states {max(exact)} B = 16Ψ/N + padding, sent {sent:.0f} B/step = theory")
'
  done
done

run accum 2 ch08_zero3 "${common[@]}" --eval-every-epoch 0 --grad-accum-steps 3
summary "$WORK/accum.jsonl" "$WORK/ch08_n2_on.jsonl" - '
assert s["bytes_sent_per_rank_per_step"] == 3 * r7["bytes_sent_per_rank_per_step"], "K = 3: every micro-step communicates"
assert s["bytes_sent_per_rank_per_step"] == max(s["theory_bytes_sent_per_rank_per_step"])
print("ok: K = 3 sends 3x per optimizer step")
'

run ring 3 ch08_zero3 "${common[@]}" --eval-every-epoch 0
run mpi 3 ch08_zero3 "${common[@]}" --eval-every-epoch 0 --collectives mpi
start_point start "${common[@]}"
run ring_sgd 3 ch08_zero3 "${common[@]}" --eval-every-epoch 0 "${sgd[@]}"
run mpi_sgd 3 ch08_zero3 "${common[@]}" --eval-every-epoch 0 --collectives mpi "${sgd[@]}"
close ring mpi start 6
summary "$WORK/mpi.jsonl" "$WORK/ring.jsonl" - '
for c in s["comm"]:
    assert c["training"]["bytes_sent"] == s["steps"] * s["theory_bytes_sent_per_rank_per_step"][c["rank"]], c
print("ok: --collectives mpi counters equal their theory")
'

for np in 1 2; do
  run trace_n$np $np ch08_zero3 "${common[@]}" --eval-every-epoch 0 --trace "$WORK/trace_n$np.json" --trace-steps 3
  python3 - "$WORK/trace_n$np.json" "$np" <<'EOF'
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
np_, steps, layers = int(sys.argv[2]), 3, ["0", "2", "4"]
assert {e["pid"] for e in events} == set(range(np_)), "one process per rank"
for rank in range(np_):
    mine = [e for e in events if e["pid"] == rank and e["ph"] != "M"]
    def all_of(name): return sorted((e for e in mine if e["name"] == name), key=lambda e: e["ts"])
    for i, l in enumerate(layers):
        fwd, bwd = all_of("forward %s (Linear)" % l), all_of("backward %s (Linear)" % l)
        assert len(fwd) == len(bwd) == steps, (l, len(fwd), len(bwd))
        for name in ("all_gather %s (forward)" % l, "all_gather %s (backward)" % l, "reduce_scatter " + l):
            assert len(all_of(name)) == steps and all(e["tid"] == 1 for e in all_of(name)), name
        nxt = [("forward", fwd, layers[i + 1])] if i + 1 < len(layers) else []
        prv = [("backward", bwd, layers[i - 1])] if i > 0 else []
        for phase, compute, other in nxt + prv:
            posts = all_of("post all_gather %s (%s)" % (other, phase))
            assert len(posts) == steps
            for p, c in zip(posts, compute):  # posted before this layer's compute ends (even starts)
                assert p["ts"] <= c["ts"] < c["ts"] + c["dur"], (phase, l, other, p["ts"], c["ts"])
print(f"ok: trace at np {np_}: every next gather posted before the current layer computes")
EOF
done

for np in 2 3 4; do  # one rank runs layer 2 once more in step 2: all stop, fast, with a message
  start=$(date +%s)
  if timeout 60 "$MPIRUN" -np $np --oversubscribe "$BIN/zero3_desync" "${common[@]}" --eval-every-epoch 0 \
      --debug-desync-rank $((np - 1)) --debug-desync-layer 2 >"$WORK/desync_n$np.log" 2>&1; then
    echo "FAILED: a desynchronised rank did not stop the run (np $np)"; exit 1
  fi
  elapsed=$(( $(date +%s) - start ))
  if [ $elapsed -ge 20 ]; then echo "FAILED: desync took ${elapsed}s to stop (np $np)"; cat "$WORK/desync_n$np.log"; exit 1; fi
  # Whichever rank notices first reports, naming its own collective first: layer 2 may be either.
  grep -q "ranks out of step: ZeRO-3 collective #[0-9]* is .*the all-gather of layer 2 for its forward" "$WORK/desync_n$np.log" ||
    { echo "FAILED: no desync message (np $np)"; cat "$WORK/desync_n$np.log"; exit 1; }
  grep -q "Every rank must run the same layers in the same order" "$WORK/desync_n$np.log"
  echo "ok: desync at np $np stopped every rank in ${elapsed}s: $(grep -o 'ZeRO-3 collective #[0-9]* is [^(]*' "$WORK/desync_n$np.log" | head -1)"
done
