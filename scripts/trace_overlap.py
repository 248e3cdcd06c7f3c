#!/usr/bin/python3
"""How much of each rank's communication a RingZero --trace file shows hidden behind compute.

    python3 scripts/trace_overlap.py run.json            (the host's tracks)
    python3 scripts/trace_overlap.py run.json --gpu      (--device cuda: the GPU's streams)

Per rank: the time the communication track was busy (the union of its spans: the comm thread's
collectives, or the GPU communication stream's), and how much of that the compute track's
forward and backward spans covered at the same moment (the main thread's, or the GPU compute
stream's): overlap = covered / busy. The optimizer step is not counted as compute (ZeRO-1/2's
all-gathers overlap it by design, a different lesson). On the host the compute track is the
main thread's wall clock, which also runs while a core is shared; on the GPU it is when the GPU
ran the work (CUDA events, common/report/trace.hpp). Prints one line per rank and a JSON line
({"rank": r, "comm_ms": ..., "overlapped_ms": ..., "overlap": ...} per rank) for scripts.
"""
import argparse
import json
import sys

TRACKS = {False: (0, 1), True: (2, 3)}  # (compute, communication): common/report/trace.hpp


def union(spans):
    """Sorted disjoint [start, end) intervals covering the spans."""
    out = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return out


def covered(intervals, by):
    """Length of `intervals` that the disjoint sorted intervals `by` also cover."""
    total, j = 0.0, 0
    for start, end in intervals:
        while j < len(by) and by[j][1] <= start:
            j += 1
        k = j
        while k < len(by) and by[k][0] < end:
            total += min(end, by[k][1]) - max(start, by[k][0])
            k += 1
    return total


def overlap(events, gpu):
    compute_tid, comm_tid = TRACKS[gpu]
    ranks = sorted({e["pid"] for e in events if e.get("ph") == "X"})
    rows = []
    for r in ranks:
        spans = [e for e in events if e.get("ph") == "X" and e["pid"] == r]
        comm = union((e["ts"], e["ts"] + e["dur"]) for e in spans if e["tid"] == comm_tid)
        compute = union((e["ts"], e["ts"] + e["dur"]) for e in spans
                        if e["tid"] == compute_tid and e.get("cat") in ("forward", "backward"))
        busy = sum(end - start for start, end in comm)
        hidden = covered(comm, compute)
        rows.append({"rank": r, "comm_ms": busy / 1e3, "overlapped_ms": hidden / 1e3,
                     "overlap": hidden / busy if busy > 0 else 0.0})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--gpu", action="store_true", help="the GPU's streams (--device cuda)")
    args = ap.parse_args()
    try:
        events = json.load(open(args.trace))["traceEvents"]
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"trace_overlap.py: {args.trace} is not a --trace file ({e}); make one with "
                 "--trace FILE")
    rows = overlap(events, args.gpu)
    if not any(row["comm_ms"] > 0 for row in rows):
        sys.exit(f"trace_overlap.py: {args.trace} has no span on the "
                 f"{'GPU communication stream' if args.gpu else 'comm thread'}: "
                 + ("trace a --device cuda run" if args.gpu else "trace chapters 05-08"))
    for row in rows:
        print(f"rank {row['rank']}: communication {row['comm_ms']:.2f} ms, "
              f"{row['overlapped_ms']:.2f} ms of it beside forward/backward "
              f"({100 * row['overlap']:.0f} %)")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
