#!/usr/bin/python3
"""Makes the external reference for tests/unit/golden_toy_test.cpp: PyTorch training the
ToyModel (an MLP 1024->1024->1024->256 with MSE) for 5 AdamW steps on one fixed batch.

Run once, with Debian's python3-torch (1.13), and commit the outputs; the tests need no PyTorch:
    /usr/bin/python3 tests/golden/make_toy_golden.py

Model: nn.Sequential(Linear(1024, 1024), ReLU, Linear(1024, 1024), ReLU, Linear(1024, 256)),
torch.manual_seed(0), PyTorch's default init; loss nn.MSELoss(); optimizer torch.optim.AdamW with
its defaults (lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 1e-2); the same batch (x 64 x
1024, y 64 x 256, standard normal) at each of the 5 steps; one thread, float32.

Writes (safetensors written by hand below: the safetensors package is not in Debian):
  toy_init.safetensors   the initial state_dict ("0.weight", "0.bias", ..., "4.bias"), 9.4 MB
  toy_batch.safetensors  "x" (64, 1024), "y" (64, 256)
  toy_final.safetensors  the state after 5 steps, kept small: the last layer and every bias in
                         full; of 0.weight and 2.weight (1M elements each) every 97th element
                         ("0.weight.every97", flattened row-major) and the sum of each row
                         ("0.weight.row_sums", accumulated in float64): a wrong element anywhere
                         moves its row's sum, and the samples cover every row and column.
  toy_losses.json        the loss before each of the 5 steps, in float64 from float32 values.
"""
import json
import os
import struct

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 5
STRIDE = 97


def save_safetensors(path, tensors):
    """The safetensors layout (huggingface/safetensors README): u64 LE header size, JSON header
    {name: {dtype, shape, data_offsets}}, then the raw little-endian data, tensors sorted."""
    header, blobs, offset = {"__metadata__": {"producer": "tests/golden/make_toy_golden.py"}}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().to(torch.float32)
        data = t.numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 256))
    x, y = torch.randn(64, 1024), torch.randn(64, 256)
    save_safetensors(os.path.join(HERE, "toy_init.safetensors"), model.state_dict())
    save_safetensors(os.path.join(HERE, "toy_batch.safetensors"), {"x": x, "y": y})

    optimizer = torch.optim.AdamW(model.parameters())  # the defaults, as our --optimizer adamw
    loss_fn = nn.MSELoss()
    losses = []
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())

    final = {}
    for name, t in model.state_dict().items():
        if name in ("0.weight", "2.weight"):
            final[name + ".every97"] = t.flatten()[::STRIDE]
            final[name + ".row_sums"] = t.double().sum(dim=1).float()
        else:
            final[name] = t
    save_safetensors(os.path.join(HERE, "toy_final.safetensors"), final)
    with open(os.path.join(HERE, "toy_losses.json"), "w") as f:
        json.dump({"torch_version": torch.__version__, "steps": STEPS, "losses": losses}, f, indent=1)
        f.write("\n")
    print("losses", losses)


if __name__ == "__main__":
    main()
