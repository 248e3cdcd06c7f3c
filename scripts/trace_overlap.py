#!/usr/bin/python3
"""How much of each rank's communication a RingZero --trace file shows hidden behind compute.

    python3 scripts/trace_overlap.py run.json            (the host's tracks)
    python3 scripts/trace_overlap.py run.json --gpu      (--device cuda: the GPU's streams)

Per rank: the time the communication track was busy (the union of its spans: the comm thread's
collectives, or the GPU communication stream's), and how much of that the compute track's
forward and backward spans covered at the same moment (the main thread's, or the GPU compute
stream's), less the main thread's waits for the communication queue (on the GPU, their twins on
the compute stream): a bucket launched inside a layer's backward may be waited for there
(--no-overlap; ZeRO-2 freeing a bucket), and the layer's span then holds that wait
(common/report/trace.hpp, common/comm/comm_queue.hpp). overlap = covered / busy. The optimizer step
is not counted as compute (ZeRO-1/2's all-gathers overlap it by design, a different lesson). On the host the compute track is the
main thread's wall clock, which also runs while a core is shared; on the GPU it is when the GPU
ran the work (CUDA events, common/report/trace.hpp).
On the host it also splits the main thread's waits for the queue, each at the end of the job it
waited for ("wait <job>": that job's span on the comm track; "wait for collectives": the last
job to end before it): before that end, the stretch while the comm thread ran a job, and the
stretch while it ran none (woken by the submit but not yet running: a core it waits for); after
it, the main thread woken but not yet running again. --attribute counts all three as the
queue's wait (communication, less what the comm thread spent waiting for a peer: peer_wait); a
shared or crowded core stretches the last two.
Prints, per rank, per traced step (the trace's "step N" spans; totals over the trace when it has
none), then a JSON line of totals over the trace for scripts: {"rank": r, "steps": ...,
"comm_ms": ..., "overlapped_ms": ..., "overlap": ..., and on the host "wait_ms",
"wait_running_ms", "wait_comm_idle_ms", "after_done_ms"} per rank.
"""
import argparse
import json
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
from trace_events import load_events  # noqa: E402 (beside this script)

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


def minus(intervals, holes):
    """The disjoint sorted `intervals` with the disjoint sorted `holes` cut out."""
    out = []
    for start, end in intervals:
        for h_start, h_end in holes:
            if h_end <= start or h_start >= end:
                continue
            if h_start > start:
                out.append([start, h_start])
            start = max(start, h_end)
        if start < end:
            out.append([start, end])
    return out


def split_waits(mine, compute_tid, comm_tid, comm):
    """The main thread's waits for the queue, in ms: (all, while the comm thread ran a job,
    while it ran none before the job's end, after the job had ended). The job of a wait is the
    one of its name that ended last before the wait did; for "wait for collectives", the last
    job to end before it. `comm`: the comm track's busy intervals (union)."""
    ends = {}  # job name -> its spans' ends, in order
    for e in sorted((e for e in mine if e["tid"] == comm_tid), key=lambda e: e["ts"] + e["dur"]):
        ends.setdefault(e["name"], []).append(e["ts"] + e["dur"])
    every_end = sorted(end for job_ends in ends.values() for end in job_ends)
    total = running = after = 0.0
    for e in mine:
        if e["tid"] != compute_tid or e.get("cat") != "wait":
            continue
        start, end = e["ts"], e["ts"] + e["dur"]
        job = e["name"][len("wait "):] if e["name"].startswith("wait ") else None
        done = [t for t in ends.get(job, every_end) if t <= end]
        done_at = max(done[-1], start) if done else end
        total += end - start
        running += covered([[start, done_at]], comm)
        after += end - done_at
    return total / 1e3, running / 1e3, (total - running - after) / 1e3, after / 1e3


def overlap(events, gpu):
    compute_tid, comm_tid = TRACKS[gpu]
    spans = [e for e in events if e["ph"] == "X"]
    rows = []
    for r in sorted({e["pid"] for e in spans}):
        mine = [e for e in spans if e["pid"] == r]
        comm = union((e["ts"], e["ts"] + e["dur"]) for e in mine if e["tid"] == comm_tid)
        # The main thread's waits, on the compute track's own clock: on the GPU their twins, the
        # compute stream's idle gaps (the host's wait starts while the stream still runs the
        # work queued before it, so the host's interval would cut real kernels out).
        waits = union((e["ts"], e["ts"] + e["dur"]) for e in mine
                      if e["tid"] == compute_tid and e.get("cat") == "wait")
        compute = minus(union((e["ts"], e["ts"] + e["dur"]) for e in mine
                              if e["tid"] == compute_tid and e.get("cat") in ("forward", "backward")),
                        waits)
        busy = sum(end - start for start, end in comm)
        hidden = covered(comm, compute)
        steps = sum(1 for e in mine if e.get("cat") == "step")
        rows.append({"rank": r, "steps": steps, "comm_ms": busy / 1e3, "overlapped_ms": hidden / 1e3,
                     "overlap": hidden / busy if busy > 0 else 0.0})
        if not gpu:  # the GPU's twins are the stream's idle gaps, not a thread's wake-up
            keys = ("wait_ms", "wait_running_ms", "wait_comm_idle_ms", "after_done_ms")
            rows[-1].update(zip(keys, split_waits(mine, compute_tid, comm_tid, comm)))
    return rows


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # | head: end quietly, as a shell tool does
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--gpu", action="store_true", help="the GPU's streams (--device cuda)")
    args = ap.parse_args()
    rows = overlap(load_events(args.trace, "trace_overlap.py"), args.gpu)
    if not any(row["comm_ms"] > 0 for row in rows):
        sys.exit(f"trace_overlap.py: {args.trace} has no span on the "
                 f"{'GPU communication stream' if args.gpu else 'comm thread'}: "
                 + ("trace a --device cuda run" if args.gpu else "trace chapters 05-08"))
    for row in rows:
        n = row["steps"]
        per = (lambda ms: ms / n) if n else (lambda ms: ms)  # noqa: E731
        print(f"rank {row['rank']}, " + (f"ms per step over {n} traced steps" if n else
                                           "ms over the trace (no step spans)") + ":")
        print(f"  comm thread busy {per(row['comm_ms']):.2f}, {per(row['overlapped_ms']):.2f} of it "
              f"beside forward/backward ({100 * row['overlap']:.0f} %)")
        if "wait_ms" in row:
            print(f"  main thread waiting for the queue {per(row['wait_ms']):.2f}: "
                  f"{per(row['wait_running_ms']):.2f} while the comm thread ran a job, "
                  f"{per(row['wait_comm_idle_ms']):.2f} while it ran none (not yet running the "
                  f"job: a core), {per(row['after_done_ms']):.2f} after the job had ended "
                  f"(woken, not yet running)")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
