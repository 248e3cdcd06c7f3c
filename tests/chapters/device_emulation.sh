#!/usr/bin/env bash
# Chapters 03-08 with --device cuda, run on the CPU emulation of the GPU path (tests/emul: the
# device layer in host memory, every kernel the same per-element function of common/kernels.hpp
# in a loop, SGEMM a reference BLAS loop), against the same chapter on the CPU. What runs is the
# GPU path's own host code: common/gpu/device_parallel.cpp (each chapter's communication on
# device buffers: the central reducer, chapter 04's ring template over DeviceComm, buckets
# posted from the backward hook, ZeRO-1/2's padded layout and ZeRO-3's per-layer gathers), the
# device trainer and its hooks, and the staged transport (the one that lets ranks share a GPU)
# over real MPI. What it cannot test: CUDA, cuBLAS and NCCL themselves (scripts/gpu-check).
#
# Criteria, for every chapter at N = 1..4 (03 and 04 at N = 2, 3; the ToyModel with SGD momentum
# and clipping at N = 3):
#  - numbers: `close` in lib.bash (SGD relative L2 1e-4 of the movement and losses within 1e-6;
#    AdamW's own bound): the GPU step's products sum in another order than Eigen's (the
#    reference SGEMM adds k in order), and it divides by N as a multiplication by 1/N, so
#    equality is to float32 rounding, not bitwise;
#  - traffic: every rank sends exactly the CPU chapter's bytes per step (its summary record):
#    the device collectives are counted in the host counters under the same names.
source "$(dirname "$0")/lib.bash"
EMUL=../emul

# metrics_sent NAME: every rank's bytes under "metrics" (whole run), space-separated.
metrics_sent() {
  python3 -c '
import json, sys
s = [json.loads(l) for l in open(sys.argv[1]) if "\"summary\"" in l][-1]
print(" ".join(str(c["ops"].get("metrics", {}).get("bytes_sent", 0)) for c in s["comm"]))' "$WORK/$1.jsonl"
}
start_point start --model mlp --seed 3
pairs() {  # pairs CHAPTER NP ARGS...: the CPU run and the emulated GPU run, AdamW and SGD
  local ch=$1 np=$2; shift 2
  local name=${ch:0:2}_n$np
  run cpu_$name $np ch$ch "$@"
  run gpu_$name $np $EMUL/emul_ch$ch "$@" --device cuda
  run cpu_${name}_sgd $np ch$ch "$@" "${sgd[@]}"
  run gpu_${name}_sgd $np $EMUL/emul_ch$ch "$@" "${sgd[@]}" --device cuda
  close cpu_$name gpu_$name start 8
  expect_eq "$(sent gpu_$name)" "$(sent cpu_$name)" "$ch np $np: the GPU path sends the CPU's bytes on every rank"
  expect_eq "$(metrics_sent gpu_$name)" "$(metrics_sent cpu_$name)" "$ch np $np: and the CPU's metrics bytes (loss, NaN guard, clipping, collective checks)"
  grep -q "transport staged-mpi" "$WORK/gpu_$name.log" || { echo "FAILED: no transport line"; exit 1; }
}
common=(--model mlp --global-batch-size 48 --max-steps 8 --eval-every-epoch 0 --seed 3)
for np in 2 3; do
  pairs 03_data_parallel $np "${common[@]}"
  pairs 04_ring_allreduce $np "${common[@]}"
done
pairs 04_ring_allreduce 2 "${common[@]}" --collectives mpi
for np in 1 2 3 4; do
  pairs 05_ddp_buckets $np "${common[@]}" --bucket-cap-mb 0.5 --grad-accum-steps 2
  pairs 06_zero1 $np "${common[@]}" --bucket-cap-mb 0.5
  pairs 07_zero2 $np "${common[@]}" --bucket-cap-mb 0.5 --grad-accum-steps 2
  pairs 08_zero3 $np "${common[@]}" --grad-accum-steps 2
done
# The transport's collectives (the async calls: on NCCL they overlap), ZeRO-2 with K = 1 (two
# bucket buffers reused), ZeRO-3 without prefetch.
pairs 05_ddp_buckets 3 "${common[@]}" --collectives mpi --bucket-cap-mb 0.5
pairs 06_zero1 3 "${common[@]}" --collectives mpi --clip-grad-norm 0.5
pairs 07_zero2 3 "${common[@]}" --bucket-cap-mb 0.5
pairs 07_zero2 2 "${common[@]}" --collectives mpi --bucket-cap-mb 0.5
pairs 08_zero3 3 "${common[@]}" --collectives mpi
pairs 08_zero3 2 "${common[@]}" --no-prefetch

# The GPU's model states (the ledger's device column): ZeRO-3 keeps 4 + 4 + 8 bytes per element
# of each rank's layer shards, s_l = ceil(Ψ_l / N), and nothing else (gathered layers and layer
# gradients are comm_buffers); the summary's device_model_states_bytes_per_rank says so.
check_summaries <<'PY'
import math
s = summary("gpu_08_n3")
sizes = [784, 512, 512, 10]  # the MLP
shard = sum(math.ceil((sizes[l] * sizes[l + 1] + sizes[l + 1]) / 3) for l in range(3))
assert s["device_model_states_bytes_per_rank"] == 16 * shard, (s["device_model_states_bytes_per_rank"], 16 * shard)
print("ok: ZeRO-3 device model states", s["device_model_states_bytes_per_rank"], "= 16 x", shard)
PY

# ZeRO-3's evaluation reads the lesson's shards, which the GPU path writes back: the test loss
# after an epoch equals the CPU's to float32 rounding.
run cpu_08_eval 2 ch08_zero3 --model mlp --global-batch-size 600 --epochs 1 --max-steps 3 --seed 3
run gpu_08_eval 2 $EMUL/emul_ch08_zero3 --model mlp --global-batch-size 600 --epochs 1 --max-steps 3 --seed 3 --device cuda
check_summaries <<'PY'
a, b = summary("cpu_08_eval"), summary("gpu_08_eval")
assert abs(a["test_loss"] - b["test_loss"]) < 1e-4, (a["test_loss"], b["test_loss"])
assert b["device_transport"] == "staged-mpi", b
print("ok: ZeRO-3 test loss on the GPU path", b["test_loss"], "CPU", a["test_loss"])
PY

# --trace: the GPU path's spans of both streams (DeviceClock marks; here the host clock), on
# tracks "GPU compute stream" (each layer's forward and backward, the optimizer step) and "GPU
# communication stream" (every collective, named as the counters name it), per rank.
for ch in 05_ddp_buckets 08_zero3; do
  timeout 120 "$MPIRUN" -np 2 --oversubscribe "$BIN/$EMUL/emul_ch$ch" --model mlp --global-batch-size 48 \
    --max-steps 3 --eval-every-epoch 0 --device cuda --trace "$WORK/trace_$ch.json" --trace-steps 2 \
    >"$WORK/trace_$ch.log" 2>&1 || { cat "$WORK/trace_$ch.log"; exit 1; }
  python3 - "$WORK/trace_$ch.json" "$ch" <<'PY'
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
spans = [e for e in events if e.get("ph") == "X" and e["cat"] == "gpu"]
for rank in (0, 1):
    assert names[(rank, 2)] == "GPU compute stream" and names[(rank, 3)] == "GPU communication stream", names
    compute = [e for e in spans if e["pid"] == rank and e["tid"] == 2]
    comm = [e for e in spans if e["pid"] == rank and e["tid"] == 3]
    layers = 3  # the MLP's Linear layers
    fwd = [e for e in compute if e["name"].startswith("forward ")]
    bwd = [e for e in compute if e["name"].startswith("backward ")]
    assert len(fwd) == len(bwd) == 2 * layers, (len(fwd), len(bwd))  # 2 traced steps
    assert all(e["dur"] >= 0 for e in spans)
    ops = {e["name"] for e in comm}
    want = {"ring_reduce_scatter", "ring_all_gather"}
    assert want <= ops, ops
    if sys.argv[2].startswith("08"):  # per layer: 2 gathers + 1 reduce-scatter, 2 steps
        assert len(comm) == 2 * 3 * layers, len(comm)
print("ok:", sys.argv[2], "trace has both GPU streams on both ranks")
PY
done

# The ToyModel: MSE, SGD with momentum, clipping, through ZeRO-1's shards and chapter 05's buckets.
# lr 1e-2: the clipped steps must move the weights far more than one float32 ulp of their
# values (~2e-9 here, where the two paths' updates round apart on a few thousand elements);
# at lr 1e-3 the movement was 8.8e-4 and those ulps alone came to 9.8e-5 of it.
start_point toy_start --model toy --seed 5
toy=(--model toy --global-batch-size 48 --max-steps 6 --seed 5 --optimizer sgd --momentum 0.9
     --weight-decay 0 --clip-grad-norm 0.1 --lr 1e-2 --eval-every-epoch 0)
for ch in 05_ddp_buckets 06_zero1; do
  run cpu_toy_$ch 3 ch$ch "${toy[@]}"
  run gpu_toy_$ch 3 $EMUL/emul_ch$ch "${toy[@]}" --device cuda
  same cpu_toy_$ch gpu_toy_$ch --start "$WORK/toy_start.safetensors" --rel-l2 1e-4 --loss-atol 1e-5
done
echo "PASS: chapters 03-08 with --device cuda on the CPU emulation match the CPU chapters"
