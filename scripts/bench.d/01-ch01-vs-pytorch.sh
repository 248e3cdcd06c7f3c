#!/usr/bin/env bash
# Chapter 01 against PyTorch 1.13 (Debian python3-torch) on one thread, in the same run:
#   1. ToyModel (1024-1024-1024-256, MSE, AdamW, batch 64, synthetic data): median ms per step
#      over 30 steps, ours from the metrics summary (ms_per_step, first step excluded), PyTorch's
#      from bench/peers/torch_toymodel.py (30 steps after 3 warm-up). Goal: ours <= 0.75x.
#   2. Fashion-MNIST MLP (784-512-512-10, cross-entropy, AdamW, batch 64): samples/s over one
#      epoch of training steps (batch gathering included, evaluation excluded), ours from the
#      step records, PyTorch's from bench/peers/torch_fashion_mlp.py --epochs 1.
# Skips (with a notice) where /usr/bin/python3 cannot import torch, where bench/peers/ is
# missing, or (part 2) where Fashion-MNIST is not installed.
#   BUILD=build-debug scripts/bench.d/01-ch01-vs-pytorch.sh   another build directory (default: build)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
CH01="$BUILD/bin/ch01_training_loop"
PY=/usr/bin/python3
PEERS="$(git rev-parse --show-toplevel)/bench/peers"
DATA=/usr/share/datasets/fashion-mnist
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1  # one thread, both sides

[ -x "$CH01" ] || { echo "skipped: $CH01 not built (scripts/bench builds it)"; exit 0; }
if ! "$PY" -c 'import torch' 2>/dev/null; then
  echo "skipped: $PY cannot import torch (install python3-torch to compare with PyTorch)"; exit 0
fi
[ -d "$PEERS" ] || { echo "skipped: peer scripts not found at $PEERS"; exit 0; }

# summary_field FILE.jsonl FIELD: a field of the {"type":"summary"} record.
summary_field() {
  "$PY" -c 'import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["type"] == "summary": print(r[sys.argv[2]])' "$1" "$2"
}

echo "ToyModel 1024-1024-1024-256, MSE, AdamW, batch 64, one thread: median ms/step over 30 steps"
"$CH01" --model toy --global-batch-size 64 --epochs 2 --max-steps 30 --eval-every-epoch 0 --log-every 1000 \
  --metrics "$TMP/toy.jsonl" >/dev/null
ours_toy=$(summary_field "$TMP/toy.jsonl" ms_per_step)
torch_toy=$("$PY" "$PEERS/torch_toymodel.py" --steps 30 --threads 1 | sed -n 's/.*median_step_ms=\([0-9.]*\).*/\1/p')
"$PY" -c 'import sys
ours, torch = float(sys.argv[1]), float(sys.argv[2])
print(f"  ours (ch01)    {ours:8.2f} ms/step")
print(f"  PyTorch 1.13   {torch:8.2f} ms/step")
r = ours / torch
verdict = "met" if r <= 0.75 else "NOT met"
print(f"  ratio ours/PyTorch = {r:.2f}  (goal <= 0.75: {verdict})")' "$ours_toy" "$torch_toy"

echo
echo "Fashion-MNIST MLP 784-512-512-10, AdamW, batch 64, one thread: samples/s over one epoch"
if [ ! -f "$DATA/train-images-idx3-ubyte.gz" ]; then
  echo "  skipped: Fashion-MNIST not installed at $DATA (scripts/setup installs it)"; exit 0
fi
"$CH01" --epochs 1 --eval-every-epoch 0 --log-every 100000 --metrics "$TMP/mlp.jsonl" >/dev/null
ours_mlp=$("$PY" -c 'import json, sys
steps = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in steps if r["type"] == "step"]
print(64 * len(steps) / (sum(r["ms_per_step"] for r in steps) / 1e3))' "$TMP/mlp.jsonl")
torch_mlp=$("$PY" "$PEERS/torch_fashion_mlp.py" --epochs 1 --threads 1 | sed -n 's/.*samples_per_s \([0-9.]*\).*/\1/p')
"$PY" -c 'import sys
ours, torch = float(sys.argv[1]), float(sys.argv[2])
print(f"  ours (ch01)    {ours:8.0f} samples/s")
print(f"  PyTorch 1.13   {torch:8.0f} samples/s")
print(f"  ratio ours/PyTorch = {ours / torch:.2f} in throughput ({torch / ours:.2f} in time per sample)")' "$ours_mlp" "$torch_mlp"
