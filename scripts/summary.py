#!/usr/bin/env python3
"""Prints the main job's summary table from the chapters' --metrics files (their last
{"type":"summary"} line): chapter, world size, final loss, test accuracy, time per step,
model-state bytes per rank, bytes sent per rank per step."""
import json
import sys


def human(n):
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000.0


rows = []
for path in sys.argv[1:]:
    summary = None
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("type") == "summary":
                summary = rec
    if summary is None:
        print(f"{path}: no summary line (did the run finish?)", file=sys.stderr)
        continue
    acc = summary.get("test_accuracy")
    rows.append([
        summary["chapter"], str(summary["world_size"]), f"{summary['final_loss']:.4f}",
        "n/a" if acc is None or acc < 0 else f"{100 * acc:.2f} %", f"{summary['ms_per_step']:.1f} ms",
        human(summary["model_states_bytes_per_rank"]), human(summary["bytes_sent_per_rank_per_step"]),
    ])
head = ["chapter", "world", "final loss", "test acc", "time/step", "model states/rank", "sent/rank/step"]
widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
fmt = " | ".join("{:<%d}" % w for w in widths)
print(fmt.format(*head).rstrip())
print("-+-".join("-" * w for w in widths))
for r in rows:
    print(fmt.format(*r).rstrip())
