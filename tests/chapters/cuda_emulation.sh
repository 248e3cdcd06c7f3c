#!/usr/bin/env bash
# Every chapter with --device cuda, on the CPU emulation of the GPU layer (tests/emul: host
# memory, each kernel of common/device/gpu/kernels.cu the same element function of
# common/core/kernels.hpp in a loop, SGEMM a reference column-major loop), against the same command
# on the CPU. What runs is the chapter's own train_step on the CUDA backend's table
# (common/device/gpu/cuda_backend.cpp, linear.cpp: the code a GPU runs, less CUDA itself), the
# communicator handing every message to the NCCL transport (common/device/gpu/nccl_transport.cpp,
# over tests/emul/nccl_emul.cpp: NCCL as MPI calls). What it cannot test: CUDA, cuBLAS, NCCL and
# the kernels' launch (scripts/gpu-check; the emulated device of chapter_device_backend proves no
# host loop touches device memory).
#
# Criteria, every chapter (03-08 at N = 1..4):
#  - numbers: `close` in lib.bash (SGD: relative L2 1e-4 of the movement, losses within 1e-6;
#    AdamW's own bound): the reference SGEMM adds a product's k terms in order, Eigen in blocks,
#    so the runs agree to float32 rounding, not bitwise;
#  - traffic: every rank sends exactly the CPU run's bytes (its summary record);
#  - 16 bits (chapters 01, 04, 06, 08): AdamW's bound alone (16 bits need AdamW), the same bytes;
#  - NCCL against --device-comm mpi (staged through host memory), chapters 03-08 at N = 3 and
#    both --collectives: bitwise, with the same bytes and the banner naming each (the same
#    computation; only what moves the messages differs, and the emulated NCCL's collective sums
#    are MPI's: on a GPU NCCL's differ in the last bits at N >= 3, scripts/gpu-check's bounds).
source "$(dirname "$0")/lib.bash"
EMUL=../emul
start_point start --model mlp --seed 3
pairs() {  # pairs CHAPTER NP ARGS...: the CPU run and the emulated-CUDA run, AdamW and SGD
  local ch=$1 np=$2; shift 2
  local name=${ch:0:2}_n$np
  run cpu_$name "$np" ch$ch "$@"
  run gpu_$name "$np" $EMUL/emul_ch$ch "$@" --device cuda
  run cpu_${name}_sgd "$np" ch$ch "$@" "${sgd[@]}"
  run gpu_${name}_sgd "$np" $EMUL/emul_ch$ch "$@" "${sgd[@]}" --device cuda
  close cpu_$name gpu_$name start 8
  if [ "$np" -gt 0 ]; then  # one process communicates nothing (its summary has no "comm")
    expect_eq "$(sent gpu_$name)" "$(sent cpu_$name)" "$ch np $np: the CPU's bytes on every rank"
  fi
  grep -q "^device CPU emulation" "$WORK/gpu_$name.log" || { echo "FAILED: no device line"; exit 1; }
}
common=(--model mlp --global-batch-size 48 --max-steps 8 --eval-every-epoch 0 --seed 3)
pairs 01_training_loop 0 "${common[@]}" --clip-grad-norm 0.5
pairs 02_gradient_accumulation 0 "${common[@]}" --grad-accum-steps 2
for np in 1 2 3 4; do
  pairs 03_data_parallel $np "${common[@]}"
  pairs 04_ring_allreduce $np "${common[@]}"
  pairs 05_ddp_buckets $np "${common[@]}" --bucket-cap-mb 0.5 --grad-accum-steps 2
  pairs 06_zero1 $np "${common[@]}" --bucket-cap-mb 0.5
  pairs 07_zero2 $np "${common[@]}" --bucket-cap-mb 0.5 --grad-accum-steps 2
  pairs 08_zero3 $np "${common[@]}" --grad-accum-steps 2
done
pairs 05_ddp_buckets 3 "${common[@]}" --collectives mpi --bucket-cap-mb 0.5
pairs 08_zero3 3 "${common[@]}" --collectives mpi --no-prefetch
# 16 bits: bf16/fp16 storage through the CUDA backend's conversions and 16-bit norm, the
# fp32 master weights on the device: AdamW's bound (16 bits need AdamW) and the CPU's bytes.
half_pair() {  # half_pair CHAPTER NP ARGS...
  local ch=$1 np=$2; shift 2
  local name=${ch:0:2}_n${np}_16
  run cpu_$name "$np" ch$ch "${common[@]}" "$@"
  run gpu_$name "$np" $EMUL/emul_ch$ch "${common[@]}" "$@" --device cuda
  adam_close cpu_$name gpu_$name 8
  if [ "$np" -gt 0 ]; then
    expect_eq "$(sent gpu_$name)" "$(sent cpu_$name)" "$ch np $np 16-bit: the CPU's bytes"
  fi
}
half_pair 01_training_loop 0 --precision bf16 --clip-grad-norm 0.5
half_pair 04_ring_allreduce 3 --precision fp16
half_pair 06_zero1 2 --precision bf16 --bucket-cap-mb 0.5 --reduce-dtype fp32
half_pair 08_zero3 3 --precision bf16 --grad-accum-steps 2
# The transport: NCCL (the default with --device cuda) against MPI staged through host memory.
transport_pair() {  # transport_pair CHAPTER ARGS...
  local ch=$1; shift
  local name=${ch:0:2}_$(echo "$*" | tr -dc 'a-z0-9' | tail -c 12)
  run nccl_$name 3 $EMUL/emul_ch$ch "${common[@]}" "$@" --device cuda
  run mpi_$name 3 $EMUL/emul_ch$ch "${common[@]}" "$@" --device cuda --device-comm mpi
  same nccl_$name mpi_$name
  expect_eq "$(sent nccl_$name)" "$(sent mpi_$name)" "$ch np 3 $*: NCCL sends MPI's bytes"
  grep -q "messages over nccl on the device" "$WORK/nccl_$name.log" || {
    echo "FAILED: $ch: no NCCL in the banner"; exit 1; }
  grep -q "messages staged through host memory" "$WORK/mpi_$name.log" || {
    echo "FAILED: $ch: --device-comm mpi does not stage"; exit 1; }
}
# The emulated NCCL is built where the NCCL headers are (a CUDA build: emul_comm_check beside).
if [ -x "$EMUL/emul_comm_check" ]; then
  transport_pair 03_data_parallel
  transport_pair 04_ring_allreduce --collectives mpi
  transport_pair 05_ddp_buckets --bucket-cap-mb 0.5 --grad-accum-steps 2
  transport_pair 06_zero1 --bucket-cap-mb 0.5 --collectives mpi
  transport_pair 07_zero2 --bucket-cap-mb 0.5 --precision bf16
  transport_pair 08_zero3 --grad-accum-steps 2
  # Two ranks on one GPU: NCCL cannot; every rank stops at start-up naming both and the fix.
  fails nccl_shared_gpu "[rank 1/2]" "ranks 0 and 1 both use" "--device-comm mpi" \
    -- "$MPIRUN" -np 2 --oversubscribe -x RINGZERO_EMUL_GPUS=1 "$BIN/$EMUL/emul_ch05_ddp_buckets" \
    --model toy --device cuda --max-steps 1
else
  echo "skip: the NCCL transport pairs (a build without the CUDA toolkit has no NCCL emulation)"
fi
# The GPU's timeline in --trace (common/report/trace.hpp: timed CUDA events on each thread's
# stream). The emulated events run when they are recorded, so each GPU span must be its host
# span: every forward, backward, optimizer, step, wait and collective span has its twin on the GPU's
# track, starting within 2 ms of it (two clock readings apart, on a busy 2-core machine), and the
# overlap scripts/trace_overlap.py reads from the GPU's streams is the host tracks' within 5
# points. The CPU run of the same command has no GPU track.
timeline() {  # timeline CHAPTER ARGS...
  local ch=$1; shift
  local name=trace_${ch:0:2}
  run gpu_$name 2 $EMUL/emul_ch$ch "${common[@]}" "$@" --device cuda --trace "$WORK/gpu_$name.json"
  run cpu_$name 2 ch$ch "${common[@]}" "$@" --trace "$WORK/cpu_$name.json"
  python3 - "$WORK/gpu_$name.json" "$WORK/cpu_$name.json" "$SRC/scripts/trace_overlap.py" <<'PY' || exit 1
import json, subprocess, sys
gpu, cpu, tool = sys.argv[1:]
events = [e for e in json.load(open(gpu))["traceEvents"] if e.get("ph") == "X"]
for rank in (0, 1):
    for host, device in ((0, 2), (1, 3)):
        h = [e for e in events if e["pid"] == rank and e["tid"] == host]
        d = [e for e in events if e["pid"] == rank and e["tid"] == device]
        assert h and [e["name"] for e in h] == [e["name"] for e in d], \
            f"rank {rank}: track {device} is not track {host}'s spans: {len(d)} vs {len(h)}"
        worst = max(abs(a["ts"] - b["ts"]) for a, b in zip(h, d))
        assert worst < 2000, f"rank {rank}: a GPU span {worst:.0f} us from its host span"
def overlap(*args):
    out = subprocess.run([sys.executable, tool, *args], check=True, capture_output=True, text=True)
    return [row["overlap"] for row in json.loads(out.stdout.splitlines()[-1])]
on_host, on_gpu = overlap(gpu), overlap(gpu, "--gpu")
assert all(abs(a - b) < 0.05 for a, b in zip(on_host, on_gpu)), (on_host, on_gpu)
assert not any(e.get("tid") in (2, 3) for e in json.load(open(cpu))["traceEvents"]), \
    "the CPU run's trace has a GPU track"
print(f"timeline: GPU tracks mirror the host's; overlap host {on_host}, GPU {on_gpu}")
PY
  # scripts/render_trace.py draws the GPU's rows too (where matplotlib is: scripts/setup has it).
  if /usr/bin/python3 -c "import matplotlib" 2>/dev/null; then
    "$SRC/scripts/render_trace.py" "$WORK/gpu_$name.json" "$WORK/gpu_$name.png" --gpu >/dev/null || exit 1
    [ -s "$WORK/gpu_$name.png" ] || { echo "FAILED: render_trace.py --gpu drew nothing"; exit 1; }
  fi
}
timeline 05_ddp_buckets --bucket-cap-mb 0.5
timeline 08_zero3 --grad-accum-steps 2
echo "PASS: chapters 01-08 with --device cuda on the emulated GPU layer match the CPU; NCCL" \
  "moves what MPI moves, bit for bit; the GPU's timeline is traced"
