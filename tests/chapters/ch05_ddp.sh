#!/usr/bin/env bash
# Chapter 05's own flags, end to end:
#  - --explain-buckets prints the plan pinned in tests/unit/bucket_plan_test.cpp;
#  - --trace writes one Chrome trace with one process per rank (pid = rank): every traced step
#    has each layer's forward and backward, each bucket's all-reduce on the comm thread's track
#    (tid 1) and the optimizer step, and bucket 0 is launched before the first layer's backward
#    ends (the overlap; both recorded by the main thread, so the order is deterministic);
#  - ranks started with different bucket plans (mpirun MPMD: a different --bucket-cap-mb per
#    rank) stop at start-up with both plans in the message, instead of hanging;
#  - --find-unused-parameters changes nothing when every parameter is used (bitwise), and
#    --collectives mpi trains as close to the ring as rounding allows (MPI_Allreduce sums in its
#    own order, rounding differently in the last bit at N = 3): `close` in lib.bash (SGD:
#    relative L2 1e-4 of the movement, losses within 1e-6; AdamW: Adam's own bound, 1.2e-2
#    after 6 steps). Measured on an AMD EPYC without AVX-512: SGD relative 1.6e-6,
#    losses equal; AdamW 5.1e-7.
# Unused parameters themselves are tested in tests/mpi/ddp.cpp (a forward that skips a layer).
source "$(dirname "$0")/lib.bash"

common=(--model mlp --global-batch-size 48 --max-steps 6 --eval-every-epoch 0 --seed 3)
run explain 2 ch05_ddp_buckets "${common[@]}" --explain-buckets
grep -q "6 parameters in 2 buckets (--bucket-cap-mb 25, first bucket 1 MiB)" "$WORK/explain.log"
grep -Eq "bucket 0 +\| +267786 elements \| +1.07 MB \| grads_memory\[401920, 669706\) \| 4.bias, 4.weight, 2.bias, 2.weight" "$WORK/explain.log"
grep -Eq "bucket 1 +\| +401920 elements \| +1.61 MB \| grads_memory\[0, 401920\) \| 0.bias, 0.weight" "$WORK/explain.log"
echo "ok: --explain-buckets"

for np in 1 3; do
  run trace_n$np $np ch05_ddp_buckets "${common[@]}" --trace "$WORK/trace_n$np.json" --trace-steps 4
  python3 - "$WORK/trace_n$np.json" "$np" <<'EOF'
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
np_, steps, buckets = int(sys.argv[2]), 4, 2
assert {e["pid"] for e in events} == set(range(np_)), "one process per rank"
for rank in range(np_):
    mine = [e for e in events if e["pid"] == rank and e["ph"] != "M"]
    def count(pred): return sum(1 for e in mine if pred(e))
    for layer in ("0 (Linear)", "1 (ReLU)", "2 (Linear)", "3 (ReLU)", "4 (Linear)"):
        assert count(lambda e: e["name"] == "forward " + layer) == steps, layer
        assert count(lambda e: e["name"] == "backward " + layer) == steps, layer
    for b in range(buckets):
        reduces = [e for e in mine if e["name"] == f"all_reduce bucket {b}"]
        assert len(reduces) == steps and all(e["tid"] == 1 and e["ph"] == "X" for e in reduces), b
    assert count(lambda e: e["name"] == "optimizer step") == steps
    # Per step: bucket 0's launch comes before the end of backward 0 (the first layer's).
    launches = [e["ts"] for e in mine if e["name"] == "launch all_reduce bucket 0"]
    ends = [e["ts"] + e["dur"] for e in mine if e["name"] == "backward 0 (Linear)"]
    assert len(launches) == len(ends) == steps
    assert all(l < e for l, e in zip(sorted(launches), sorted(ends))), (launches, ends)
print(f"ok: trace at np {np_}: {len(events)} events")
EOF
done

# Different plans on the two ranks: must fail fast (the ctest TIMEOUT would catch a hang).
exe="$BIN/ch05_ddp_buckets"
if timeout 60 "$MPIRUN" -np 1 "$exe" "${common[@]}" --bucket-cap-mb 25 : -np 1 "$exe" "${common[@]}" --bucket-cap-mb 1 \
  >"$WORK/mismatch.log" 2>&1; then
  echo "FAILED: mismatched bucket plans did not stop the run"; exit 1
fi
grep -q "the bucket plans differ across ranks" "$WORK/mismatch.log"
grep -q "rank 0: 2 buckets \[267786 elements/4 params, 401920 elements/2 params\]" "$WORK/mismatch.log"
grep -q "rank 1: 3 buckets \[267786 elements/4 params, 512 elements/1 params, 401408 elements/1 params\]" "$WORK/mismatch.log"
echo "ok: mismatched bucket plans stop every rank with both plans"

run plain 3 ch05_ddp_buckets "${common[@]}"
run unused_flag 3 ch05_ddp_buckets "${common[@]}" --find-unused-parameters
same plain unused_flag --bitwise
run mpi 3 ch05_ddp_buckets "${common[@]}" --collectives mpi
start_point start "${common[@]}"
run plain_sgd 3 ch05_ddp_buckets "${common[@]}" "${sgd[@]}"
run mpi_sgd 3 ch05_ddp_buckets "${common[@]}" --collectives mpi "${sgd[@]}"
close plain mpi start 6
