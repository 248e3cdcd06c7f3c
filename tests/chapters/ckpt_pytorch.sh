#!/usr/bin/env bash
# Checkpoints, item 5: the consolidated file is PyTorch's. A ZeRO-3 checkpoint written at N = 3
# (shards of padded layers) and a chapter 05 one (one state_dict file) are consolidated with
# scripts/consolidate; PyTorch builds the same network (nn.Sequential of Linear/ReLU: the names
# 0.weight, 0.bias, 2.weight, ...), loads the file with load_state_dict(strict=True) (which
# refuses a missing, extra or misshapen tensor) and its parameters equal the run's own final
# parameters (--save-final) exactly (torch.equal: a copy, no arithmetic). The optimizer file's
# exp_avg / exp_avg_sq match each parameter's shape and its step equals the global step.
# Skipped (exit 77) where /usr/bin/python3 cannot import torch (scripts/setup --peers installs
# python3-torch).
source "$(dirname "$0")/lib.bash"
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo "SKIPPED: /usr/bin/python3 cannot import torch (install it with scripts/setup --peers)"
  exit 77
fi

base=(--model toy --hidden-sizes 24,8 --global-batch-size 48 --eval-every-epoch 0 --seed 11 --max-steps 6)
run z3 3 ch08_zero3 "${base[@]}" --checkpoint-dir "$WORK/z3"
run d5 2 ch05_ddp_buckets "${base[@]}" --checkpoint-dir "$WORK/d5"
for name in z3 d5; do
  "$BIN/consolidate_checkpoint" "$WORK/$name" "$WORK/${name}_cons.safetensors" \
    --optimizer-state "$WORK/${name}_opt.safetensors" >/dev/null
  /usr/bin/python3 - "$WORK/${name}_cons.safetensors" "$WORK/$name.safetensors" "$WORK/${name}_opt.safetensors" <<'PY'
import json, struct, sys
import torch

def load(path):  # the safetensors layout (huggingface/safetensors README); the package is not in Debian
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", info
        b, e = info["data_offsets"]
        out[name] = torch.frombuffer(bytearray(data[8 + n + b:8 + n + e]), dtype=torch.float32).reshape(info["shape"])
    return out

cons, final, opt = load(sys.argv[1]), load(sys.argv[2]), load(sys.argv[3])
model = torch.nn.Sequential(torch.nn.Linear(1024, 24), torch.nn.ReLU(), torch.nn.Linear(24, 8),
                            torch.nn.ReLU(), torch.nn.Linear(8, 256))
model.load_state_dict(cons, strict=True)
for name, p in model.state_dict().items():
    assert torch.equal(p, final[name]), name
    assert opt[name + ".exp_avg"].shape == p.shape and opt[name + ".exp_avg_sq"].shape == p.shape, name
    assert opt[name + ".step"].item() == 6, (name, opt[name + ".step"])
print(f"ok: {sys.argv[1].split('/')[-1]}: load_state_dict(strict=True) took {len(cons)} tensors, equal to the run's final parameters")
PY
done
