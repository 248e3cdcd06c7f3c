#!/usr/bin/python3
"""PyTorch reference for chapter 01 on Fashion-MNIST (scripts/bench.d/01-*.sh, chapter 01's README).

The model and recipe chapter 01 trains by default: an MLP 784 -> 512 -> 512 -> 10 (ReLU between
the Linear layers), cross-entropy, AdamW (lr 1e-3, weight decay 1e-2), 64 samples per step,
training set shuffled each epoch, pixels scaled to [0, 1] by /255 and nothing else. Reads the
IDX .gz files from --data (default /usr/share/datasets/fashion-mnist). One process on the CPU,
--threads intra-op threads.

Prints the parameter count, then one line per epoch:
  epoch E loss L test_acc A epoch_s S samples_per_s R
where samples_per_s counts the training steps of the epoch (batch gathering included,
evaluation excluded) and test_acc is the accuracy on the 10000 test images (a fraction).
"""
import argparse
import gzip
import os
import struct
import time

import numpy as np
import torch
from torch import nn


def read_idx(path: str) -> np.ndarray:
    """An IDX file (gzip-compressed) as a uint8 array of the shape its header gives."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise SystemExit(f"{path}: not an unsigned-byte IDX file (magic {zero:#x} {dtype:#x})")
    shape = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def load(data_dir: str, split: str):
    images = read_idx(os.path.join(data_dir, f"{split}-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(data_dir, f"{split}-labels-idx1-ubyte.gz"))
    x = torch.from_numpy(images.reshape(len(images), -1).astype(np.float32) / 255.0)
    return x, torch.from_numpy(labels.astype(np.int64))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=1e-2)
    p.add_argument("--hidden", default="512,512", help="hidden layer sizes, comma-separated")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    args = p.parse_args()
    if args.epochs < 1 or args.batch < 1 or args.threads < 1:
        p.error("--epochs, --batch and --threads must be >= 1")
    if not os.path.isfile(os.path.join(args.data, "train-images-idx3-ubyte.gz")):
        p.error(f"Fashion-MNIST not found in {args.data} (pass --data DIR; scripts/setup installs it)")

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    x_train, y_train = load(args.data, "train")
    x_test, y_test = load(args.data, "t10k")

    sizes = [784] + [int(h) for h in args.hidden.split(",") if h] + [10]
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    model = nn.Sequential(*layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    loss_fn = nn.CrossEntropyLoss()
    print("params", sum(t.numel() for t in model.parameters()), flush=True)

    steps = len(x_train) // args.batch  # drop the last partial batch
    for epoch in range(1, args.epochs + 1):
        model.train()
        order = torch.randperm(len(x_train))
        start = time.perf_counter()
        for s in range(steps):
            idx = order[s * args.batch:(s + 1) * args.batch]
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x_train[idx]), y_train[idx])
            loss.backward()
            optimizer.step()
        seconds = time.perf_counter() - start
        model.eval()
        with torch.no_grad():
            accuracy = (model(x_test).argmax(dim=1) == y_test).float().mean().item()
        print(f"epoch {epoch} loss {loss.item():.4f} test_acc {accuracy:.4f} epoch_s {seconds:.1f} "
              f"samples_per_s {steps * args.batch / seconds:.0f}", flush=True)


if __name__ == "__main__":
    main()
