#!/usr/bin/python3
"""Makes the external reference for the bf16 case of tests/unit/golden_toy_test.cpp: PyTorch
training the ToyModel in bf16 with fp32 master weights, 5 steps on the fixed batch of
make_toy_golden.py (same initial weights, toy_init.safetensors; same batch, toy_batch.safetensors).

Run once, with Debian's python3-torch (1.13), and commit the outputs:
    /usr/bin/python3 tests/golden/make_toy_bf16_golden.py

The recipe (Micikevicius et al. 2018, §3; what --precision bf16 implements):
  master = the fp32 initial weights; the model holds them rounded to bf16 (Tensor.to, round to
  nearest even); x is rounded to bf16; the forward runs in bf16 (nn.Linear on bf16 tensors:
  fp32 accumulation, bf16 output), the MSE loss in fp32 on the output widened to fp32; backward
  leaves bf16 gradients in the bf16 parameters; AdamW (torch.optim.AdamW 1.13's single-tensor
  update, written out: decoupled weight decay, bias corrections) updates the fp32 master and
  moments from the gradients widened to fp32; the bf16 parameters are the master rounded.
Writes:
  toy_bf16_final.safetensors  the fp32 master after 5 steps: every bias in full; of each weight
                              every 97th element (".every97") and each row's sum in float64
                              (".row_sums"), as toy_final.safetensors
  toy_bf16_losses.json        the loss before each step
"""
import json
import os

import torch
import torch.nn as nn

from make_toy_golden import HERE, STRIDE, save_safetensors

STEPS = 5


def load_safetensors(path):
    import struct
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        out[name] = torch.frombuffer(bytearray(data[a:b]), dtype=torch.float32).reshape(meta["shape"])
    return out


def main():
    torch.set_num_threads(1)
    init = load_safetensors(os.path.join(HERE, "toy_init.safetensors"))
    batch = load_safetensors(os.path.join(HERE, "toy_batch.safetensors"))
    model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 256))
    model.load_state_dict(init)
    names = [n for n, _ in model.named_parameters()]
    master = {n: p.detach().clone().float() for n, p in model.named_parameters()}
    exp_avg = {n: torch.zeros_like(master[n]) for n in names}
    exp_avg_sq = {n: torch.zeros_like(master[n]) for n in names}
    model = model.to(torch.bfloat16)
    x, y = batch["x"].to(torch.bfloat16), batch["y"]
    lr, beta1, beta2, eps, wd = 1e-3, 0.9, 0.999, 1e-8, 1e-2
    losses = []
    for step in range(1, STEPS + 1):
        for p in model.parameters():
            p.grad = None
        loss = nn.functional.mse_loss(model(x).float(), y)
        loss.backward()
        losses.append(loss.item())
        with torch.no_grad():
            for n, p in model.named_parameters():
                g = p.grad.float()
                m, v, w = exp_avg[n], exp_avg_sq[n], master[n]
                w.mul_(1 - lr * wd)
                m.mul_(beta1).add_(g, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                bc1, bc2 = 1 - beta1 ** step, 1 - beta2 ** step
                denom = (v.sqrt() / bc2 ** 0.5).add_(eps)
                w.addcdiv_(m, denom, value=-lr / bc1)
                p.copy_(w.to(torch.bfloat16))
    final = {}
    for n in names:
        t = master[n]
        if n.endswith("weight"):
            final[n + ".every97"] = t.flatten()[::STRIDE]
            final[n + ".row_sums"] = t.double().sum(dim=1).float()
        else:
            final[n] = t
    save_safetensors(os.path.join(HERE, "toy_bf16_final.safetensors"), final)
    with open(os.path.join(HERE, "toy_bf16_losses.json"), "w") as f:
        json.dump({"torch_version": torch.__version__, "steps": STEPS, "losses": losses}, f, indent=1)
        f.write("\n")
    print("losses", losses)


if __name__ == "__main__":
    main()
