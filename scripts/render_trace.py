#!/usr/bin/python3
"""Draws a RingZero --trace file (Chrome trace events) as a PNG timeline.

    python3 scripts/render_trace.py ddp.json ddp.png [--steps 3:4] [--title "..."]

One row per rank and thread (rank r main thread, rank r comm thread), time on the x axis in
milliseconds. Bars: forward (blue), backward (orange), each bucket's all-reduce on the comm
thread (green, labelled with its bucket), the wait for the buckets (grey), the optimizer step
(purple); a black tick on the main thread marks the moment a bucket's all-reduce is launched.
--steps a:b shows optimizer steps a..b (1-based, as traced) of the first rank drawn (rank 0
unless --ranks says otherwise), with a small margin;
--steps auto:K shows the K consecutive steps (after step 1) that took least time on rank 0: on
a busy machine, the window least disturbed by other processes.
--ranks a:b draws ranks a..b only; a trace of more than 32 ranks draws ranks 0..15 unless told
(one row per rank and thread: hundreds of rows would be no picture to read, and no PNG).
--gpu adds, for a --device cuda trace, each rank's GPU compute and GPU communication streams
(the spans as the GPU ran them, from CUDA events: common/report/trace.hpp) below its threads.
Needs matplotlib: Debian's python3-matplotlib, which scripts/setup installs.
"""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
from trace_events import load_events  # noqa: E402 (beside this script)

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit("render_trace.py needs matplotlib: run scripts/setup (it installs Debian's "
             "python3-matplotlib), or apt-get install python3-matplotlib")

COLORS = {"forward": "#4C72B0", "backward": "#DD8452", "comm": "#55A868", "ddp": "#B0B0B0",
          "optimizer": "#8172B3", "zero": "#55A868", "wait": "#B0B0B0"}


def labels(name):
    """A span's labels, longest first: "all_gather 2 (forward)" -> ["AG 2 fwd", "AG2", "2"],
    "forward 0" -> ["F0"], "wait reduce_scatter 0" -> ["wait RS 0", "w RS0"]."""
    name = name.replace(" (Linear)", "")
    for long, short in (("optimizer step", "opt"), ("all_reduce bucket ", "b")):
        if name.startswith(long):
            return [short + name[len(long):]]
    wait = name.startswith("wait ")
    core = name[5:] if wait else name
    for prefix, short in (("forward ", "F"), ("backward ", "B"), ("all_gather ", "AG"),
                          ("reduce_scatter ", "RS")):
        if core.startswith(prefix):
            rest = core[len(prefix):]
            layer, _, phase = rest.partition(" (")
            phase = {"forward)": " fwd", "backward)": " bwd", "state)": " state"}.get(phase, "")
            out = [f"{short}{layer}"] if short in ("F", "B") else [f"{short} {layer}{phase}", f"{short}{layer}"]
            if wait:
                out = [f"wait {out[0]}", f"w {out[1]}"]
            return out + ([layer] if not wait and short in ("AG", "RS") else [])
    return [core] if not wait else ["wait"]


def die(msg):
    sys.exit(f"render_trace.py: {msg}")


def load(path):
    """(spans, instants) of a --trace file (checked: trace_events.py)."""
    events = load_events(path, "render_trace.py")
    spans = [e for e in events if e["ph"] == "X"]
    if not spans:
        die(f"{path} holds no spans: trace a run of chapters 05-08 (--trace FILE)")
    return spans, [e for e in events if e["ph"] == "i"]


def step_window(spans, rank, spec):
    """The [t0, t1] of --steps `spec` on `rank`: a:b, the a-th to b-th traced steps (1-based, in
    the order traced: a resumed run's first traced step is 1 here, whatever its number), or
    auto:K, the K consecutive steps after the first that took least time."""
    steps = sorted((e for e in spans if e["pid"] == rank and e["cat"] == "step"),
                   key=lambda e: e["ts"])
    n = len(steps)
    if n == 0:
        die(f"--steps {spec}: rank {rank} has no step spans in this trace")
    m = re.fullmatch(r"(auto|[0-9]+):([0-9]+)", spec)
    if not m:
        die(f"--steps {spec!r}: give a:b (the a-th to b-th traced steps, 1 <= a <= b <= {n}) or "
            f"auto:K (1 <= K <= {n})")
    if m[1] == "auto":
        k = int(m[2])
        if not 1 <= k <= n:
            die(f"--steps auto:{k}: this trace holds {n} steps; give 1 <= K <= {n}")
        cost = lambda i: sum(e["dur"] for e in steps[i:i + k])  # noqa: E731
        a = min(range(1, n - k + 1), key=cost) if n > k else 0  # after the first (warm-up) step
        b = a + k - 1
        print(f"showing {steps[a]['name']}..{steps[b]['name']}")
    else:
        a, b = int(m[1]) - 1, int(m[2]) - 1
        if not 0 <= a <= b < n:
            die(f"--steps {spec}: this trace holds {n} steps ({steps[0]['name']}..{steps[-1]['name']}); "
                f"give 1 <= a <= b <= {n}")
    return steps[a]["ts"], steps[b]["ts"] + steps[b]["dur"]


MAX_RANKS = 64  # rows of a readable picture (and under matplotlib's 2^16-pixel image limit)


def pick_ranks(ranks, spec):
    """The ranks to draw: --ranks a:b (those of the trace in a..b), else all of at most 32,
    else the first 16, said on stdout."""
    if spec is None:
        if len(ranks) <= 32:
            return ranks
        print(f"showing the first 16 of {len(ranks)} ranks ({ranks[0]}..{ranks[15]}; --ranks a:b for others)")
        return ranks[:16]
    m = re.fullmatch(r"(\d+):(\d+)", spec)
    if not m or int(m[1]) > int(m[2]):
        die(f"--ranks {spec}: give a:b with a <= b, e.g. --ranks 0:7")
    a, b = int(m[1]), int(m[2])
    chosen = [r for r in ranks if a <= r <= b]
    if not chosen:
        held = ", ".join(map(str, ranks)) if len(ranks) <= 8 else f"{len(ranks)} ranks, {ranks[0]}..{ranks[-1]}"
        die(f"--ranks {spec}: no rank of this trace is in {a}..{b} (it holds {held}); give a:b around some")
    if len(chosen) > MAX_RANKS:
        die(f"--ranks {spec}: {len(chosen)} ranks are too many rows to draw; give at most {MAX_RANKS}")
    return chosen


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace")
    p.add_argument("png")
    p.add_argument("--steps", default=None, help="a:b, the optimizer steps to show (default: all)")
    p.add_argument("--title", default=None)
    p.add_argument("--comm-label", default=None,
                   help="legend of the comm thread's bars (default: the collectives the trace holds)")
    p.add_argument("--wait-label", default=None,
                   help="legend of the main thread's waits (grey; default: for buckets, or for a collective)")
    p.add_argument("--ranks", default=None, help="a:b, the ranks to draw (default: all; past 32, the first 16)")
    p.add_argument("--gpu", action="store_true", help="also the GPU's streams (a --device cuda trace)")
    args = p.parse_args()
    ext = os.path.splitext(args.png)[1].lower()
    if ext not in (".png", ".svg", ".pdf") or os.path.basename(args.png) == ext:
        die(f"{args.png!r}: give an output file ending in .png (or .svg, .pdf)")
    if os.path.isdir(args.png) or not os.path.isdir(os.path.dirname(args.png) or "."):
        die(f"cannot write {args.png}: give a .png path in an existing folder")
    spans, instants = load(args.trace)
    ranks = pick_ranks(sorted({e["pid"] for e in spans}), args.ranks)
    drawn = [e for e in spans if e["pid"] in set(ranks)]
    t0, t1 = min(e["ts"] for e in drawn), max(e["ts"] + e["dur"] for e in drawn)
    if args.steps:
        t0, t1 = step_window(spans, ranks[0], args.steps)
        margin = 0.02 * (t1 - t0)
        t0, t1 = t0 - margin, t1 + margin
    if t1 <= t0:
        die(f"{args.trace}: its spans take no time; nothing to draw")
    comm_names = [e["name"] for e in drawn if e["tid"] in (1, 3)]
    if args.comm_label is None:  # "all_reduce bucket 3", "all_gather 2 (forward)": the first word
        kinds = sorted({n.split()[0].replace("_", "-")[:24] for n in comm_names if n.strip()})
        shown = " / ".join(kinds) if 1 <= len(kinds) <= 3 else (
            f"{len(kinds)} kinds of collective" if kinds else "communication")
        args.comm_label = shown.replace("$", r"\$") + " (comm thread)"  # no mathtext
    if args.wait_label is None:
        args.wait_label = ("wait for buckets" if any("bucket" in n for n in comm_names)
                           else "wait for a collective")
    draw(args, spans, instants, ranks, t0, t1)


def draw(args, spans, instants, ranks, t0, t1):
    tids = (0, 1, 2, 3) if args.gpu else (0, 1)  # main, comm; GPU compute, GPU comm streams
    if args.gpu and not any(e["tid"] in (2, 3) for e in spans):
        sys.exit(f"render_trace.py: {args.trace} has no GPU stream track; --gpu needs a trace of a "
                 "--device cuda run")
    rows = [(r, tid) for r in ranks for tid in tids]
    y = {row: len(rows) - 1 - i for i, row in enumerate(rows)}
    fig, ax = plt.subplots(figsize=(13, 0.55 * len(rows) + 1.4), dpi=110)
    # Width of one character of a 7-point label, in ms of the x axis (axes ~88 % of the figure).
    char_ms = 7 * 0.62 / 72 / (13 * 0.88) * (t1 - t0) / 1e3
    for e in spans:
        if e["cat"] == "step" or (e["pid"], e["tid"]) not in y:
            continue
        if e["ts"] + e["dur"] < t0 or e["ts"] > t1:
            continue
        row = y[(e["pid"], e["tid"])]
        x, w = (e["ts"] - t0) / 1e3, e["dur"] / 1e3
        ax.broken_barh([(x, w)], (row - 0.38, 0.76), facecolors=COLORS.get(e["cat"], "#999999"),
                       edgecolor="white", linewidth=0.4)
        if "ReLU" in e["name"] or "finalize" in e["name"]:
            continue
        # The longest of the bar's labels that fits inside it, or none (the legend names the
        # colours): overlapping, cut-off text is worse than no text.
        shown = min(x + w, (t1 - t0) / 1e3) - max(x, 0)  # the part inside the window
        for label in labels(e["name"]):
            if len(label) * char_ms <= shown * 0.92:
                ax.text(max(x, 0) + shown / 2, row, label, ha="center", va="center", fontsize=7,
                        color="white", clip_on=True)
                break
    for e in instants:
        if (e["pid"], e["tid"]) in y and t0 <= e["ts"] <= t1:
            x = (e["ts"] - t0) / 1e3
            ax.plot([x, x], [y[(e["pid"], e["tid"])] + 0.38, y[(e["pid"], e["tid"])] + 0.62], color="black", lw=1)

    ax.set_yticks([y[row] for row in rows])
    names = {0: "main", 1: "comm", 2: "GPU compute", 3: "GPU comm"}
    ax.set_yticklabels([f"rank {r} {names[tid]}" for r, tid in rows])
    ax.set_xlim(0, (t1 - t0) / 1e3)
    ax.set_xlabel("time (ms)")
    ax.grid(axis="x", alpha=0.3)
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[k]) for k in ("forward", "backward", "comm", "ddp", "optimizer")]
    ax.legend(handles, ["forward", "backward", args.comm_label, args.wait_label, "optimizer step"],
              loc="upper center", bbox_to_anchor=(0.5, -0.18 if len(rows) <= 4 else -0.1), ncol=5, fontsize=8,
              frameon=False)
    if args.title:
        ax.set_title(args.title, fontsize=10)
    fig.tight_layout()
    try:
        fig.savefig(args.png)
    except (OSError, ValueError) as e:  # a missing folder, a format matplotlib does not write
        die(f"cannot write {args.png} ({getattr(e, 'strerror', None) or e}); give a .png path in "
            "an existing folder")
    print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
