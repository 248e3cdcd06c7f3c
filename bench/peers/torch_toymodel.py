#!/usr/bin/python3
"""PyTorch reference for the ToyModel benchmarks (scripts/bench.d/01-*.sh, 05-ddp.sh).

The ToyModel: an MLP 1024 -> 1024 -> 1024 -> 256 (ReLU between the Linear layers), mean squared
error against random targets, AdamW (lr 1e-3, PyTorch's default weight decay 1e-2), 64 samples
per rank per step, drawn in order from a synthetic regression set (1000 samples, standard
normal inputs and targets). Runs on the CPU with --threads intra-op threads per process.

  --world 1   plain training loop, one process
  --world N   N processes, DistributedDataParallel over gloo (bucket_cap_mb=25, PyTorch's
              default), each rank on its own 64 samples: "PyTorch Distributed: Experiences on
              Accelerating Data Parallel Training" (Li et al., VLDB 2020) and the PyTorch docs
              of torch.nn.parallel.DistributedDataParallel
  --zero      with --world N: torch.distributed.optim.ZeroRedundancyOptimizer (ZeRO-1) over DDP

Times --steps steps after --warmup untimed ones and prints one line, from rank 0:
  world=N threads=T batch=B zero1=0|1 median_step_ms=X samples_per_s=Y loss=Z
The bench scripts read median_step_ms. Run with Debian's /usr/bin/python3 (python3-torch;
install libopenblas0-pthread too, or PyTorch falls back to a much slower reference BLAS).
"""
import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

NUM_SAMPLES, IN_FEATURES, OUT_FEATURES = 1000, 1024, 256


def toy_model() -> nn.Module:
    return nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                         nn.Linear(1024, 256))


def train(rank: int, world: int, args: argparse.Namespace, port: int) -> None:
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)  # same initial weights on every rank (DDP also broadcasts rank 0's)
    model = toy_model()
    if world > 1:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world)
        model = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=25)
    if args.zero and world > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW,
                                            lr=1e-3)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.MSELoss()

    gen = torch.Generator().manual_seed(1000 + rank)  # each rank its own data
    x_all = torch.randn(NUM_SAMPLES, IN_FEATURES, generator=gen)
    y_all = torch.randn(NUM_SAMPLES, OUT_FEATURES, generator=gen)
    batches_per_pass = NUM_SAMPLES // args.batch  # drop the last partial batch

    times = []
    loss = torch.zeros(())
    for step in range(args.warmup + args.steps):
        i = step % batches_per_pass
        x = x_all[i * args.batch:(i + 1) * args.batch]
        y = y_all[i * args.batch:(i + 1) * args.batch]
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()  # under DDP: the bucketed all-reduce overlaps this
        optimizer.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)

    if world > 1:
        # Rank 0 reports the slowest rank's median: a step is done when every rank is.
        median = torch.tensor([statistics.median(times)], dtype=torch.float64)
        dist.all_reduce(median, op=dist.ReduceOp.MAX)
        med = median.item()
        dist.destroy_process_group()
    else:
        med = statistics.median(times)
    if rank == 0:
        print(f"world={world} threads={args.threads} batch={args.batch} zero1={int(args.zero)} "
              f"median_step_ms={med * 1e3:.2f} samples_per_s={args.batch * world / med:.0f} "
              f"loss={loss.item():.4f}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=1, help="processes (DDP over gloo when > 1)")
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps before them")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per process")
    p.add_argument("--batch", type=int, default=64, help="samples per rank per step")
    p.add_argument("--zero", action="store_true", help="ZeroRedundancyOptimizer (ZeRO-1)")
    args = p.parse_args()
    for name in ("world", "steps", "threads", "batch"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.batch > NUM_SAMPLES:
        p.error(f"--batch must be <= {NUM_SAMPLES} (the synthetic set's size), got {args.batch}")
    if args.world == 1:
        train(0, 1, args, 0)
    else:
        mp.spawn(train, args=(args.world, args, free_port()), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
