#!/usr/bin/env python3
"""The cluster tour's table (scripts/cluster-tour): per chapter, the measured median time per
optimizer step across the cluster beside the cost model's prediction (common/report/cost_model.hpp),
its parts, and measured / predicted; then the lessons of the tour checked on the measured
numbers. Arguments: SELFTEST.json CLUSTER_CONFIG METRICS.jsonl... [--json OUT]."""
import json
import sys

args = sys.argv[1:]
out = None
if "--json" in args:
    i = args.index("--json")
    out = args[i + 1]
    del args[i:i + 2]
selftest = json.load(open(args[0]))
config = dict(line.strip().split("=", 1) for line in open(args[1]) if "=" in line)
rows = []
for path in args[2:]:
    summary = [json.loads(l) for l in open(path) if '"summary"' in l]
    if not summary:
        print(f"{path}: no summary line (did the run finish?)", file=sys.stderr)
        continue
    s = summary[-1]
    p = s.get("prediction") or {}
    name = s["chapter"] + ("" if s.get("prefetch", True) else " --no-prefetch")
    rows.append({"chapter": name, "world_size": s["world_size"], "measured_ms": s["ms_per_step"],
                 "predicted_ms": p.get("predicted_ms_per_step"), "compute_ms": p.get("compute_ms"),
                 "comm_ms": p.get("comm_ms"), "overlap": p.get("overlap"),
                 "overlap_possible": p.get("overlap_possible", True), "cores": p.get("cores", 0),
                 "overlapped_ms": p.get("overlapped_ms_per_step"),
                 "sent_per_rank_per_step": s["bytes_sent_per_rank_per_step"],
                 "num_parameters": s.get("num_parameters"), "parts": p.get("parts")})
print(f"\ncluster: {config['nodes']} nodes x {config['slots']} slots, links {config['bandwidth']} "
      f"each way; selftest: latency {selftest['latency_us']:.1f} us, bandwidth "
      f"{selftest['bandwidth_bps'] / 1e9:.3f} Gbit/s (median link)"
      + (f", fabric {selftest['fabric_bps'] / 1e9:.3f} Gbit/s (every link at once)"
         if "fabric_bps" in selftest else "")
      + (f"; communication threads on CPU {config['comm_cpus']}, computation on "
         f"{'CPU' if config['compute_cpus'].isdigit() else 'CPUs'} {config['compute_cpus']} "
         f"(--comm-core)" if config.get("comm_cpus") else "")
      + (f"; model: {rows[0]['num_parameters']} parameters" if rows and rows[0]["num_parameters"] else ""))
head = ["chapter", "measured", "predicted", "meas/pred", "compute", "comm", "overlap", "sent/rank/step"]
table = []
for r in rows:
    pred = r["predicted_ms"]
    table.append([r["chapter"], f"{r['measured_ms']:.1f} ms", f"{pred:.1f} ms" if pred else "n/a",
                  f"{r['measured_ms'] / pred:.2f}" if pred else "n/a",
                  f"{r['compute_ms']:.1f} ms" if pred else "", f"{r['comm_ms']:.1f} ms" if pred else "",
                  (r["overlap"] or "") + ("" if r["overlap_possible"] or r["overlap"] == "none"
                                          else " (no core free)"), f"{r['sent_per_rank_per_step'] / 1e6:.2f} MB"])
def print_table(head, table):
    """Columns as wide as their widest cell, ' | ' between, a rule under the head."""
    widths = [max(len(t[i]) for t in table + [head]) for i in range(len(head))]
    fmt = " | ".join("{:<%d}" % w for w in widths)
    print(fmt.format(*head).rstrip())
    print("-+-".join("-" * w for w in widths))
    for t in table:
        print(fmt.format(*t).rstrip())
print_table(head, table)

# The lessons, on the measured numbers (the orderings).
by = {r["chapter"]: r for r in rows}
def m(c): return by[c]["measured_ms"] if c in by else None
def p(c): return by[c]["predicted_ms"] if c in by else None
checks = []
if m("03_data_parallel") and m("04_ring_allreduce"):
    ratio, model = m("03_data_parallel") / m("04_ring_allreduce"), p("03_data_parallel") / p("04_ring_allreduce")
    checks.append((f"04 faster than 03: measured ratio {ratio:.2f}, model's {model:.2f}", ratio > 1 and abs(ratio / model - 1) <= 0.25))
# Overlap needs a core per rank for the communication thread: where the ranks share fewer
# (the emulated cluster on a small machine), the lessons that rest on overlap cannot show.
def spare(c): return c in by and by[c]["overlap_possible"]
def na_reason(c): return f"n/a: {by[c]['world_size']} ranks share {by[c]['cores']} cores, none free for the communication thread"
if m("04_ring_allreduce") and m("05_ddp_buckets"):
    text = f"05 faster than 04: {m('05_ddp_buckets'):.1f} < {m('04_ring_allreduce'):.1f} ms"
    checks.append((text, m("05_ddp_buckets") < m("04_ring_allreduce") if spare("05_ddp_buckets") else na_reason("05_ddp_buckets")))
if m("05_ddp_buckets") and m("07_zero2"):
    d = m("07_zero2") / m("05_ddp_buckets") - 1
    checks.append((f"07 within 10 % of 05: {100 * d:+.1f} %", abs(d) <= 0.10))
if m("08_zero3") and m("08_zero3 --no-prefetch"):
    text = f"08 prefetch faster than without: {m('08_zero3'):.1f} < {m('08_zero3 --no-prefetch'):.1f} ms"
    checks.append((text, m("08_zero3") < m("08_zero3 --no-prefetch") if spare("08_zero3") else na_reason("08_zero3")))
for r in rows:
    if r["predicted_ms"]:
        d = r["measured_ms"] / r["predicted_ms"] - 1
        checks.append((f"{r['chapter']}: prediction within 25 %: {100 * d:+.1f} %", abs(d) <= 0.25))
# The account part by part (ATTRIBUTE=1: --attribute with --net-account), predicted vs measured.
parted = [r for r in rows if r["parts"] and "measured" in r["parts"]]
if parted:
    names = ["forward", "backward", "optimizer", "communication", "peer_wait", "copies", "other"]
    shown = names[:3] + ["communication + peer_wait"] + names[5:] + ["step"]
    def ms(parts, name):
        if name == "communication + peer_wait":
            return parts["communication_ms"] + parts["peer_wait_ms"]
        return parts[name + "_ms"]
    print("\nstep time by part, ms per step, predicted / measured (rank 0); "
          "interference used / measured (-: nothing overlapped):")
    head2 = ["chapter"] + shown + ["interference"]
    table2 = []
    for r in parted:
        pr, me = r["parts"]["predicted"], r["parts"]["measured"]
        table2.append([r["chapter"]] + [f"{ms(pr, n):.2f}/{ms(me, n):.2f}" for n in shown]
                      + [f"{r['parts']['interference']:.2f}/{r['parts']['measured_interference']:.2f}"
                         if r["parts"]["measured_interference"] else "-"])
        for n in shown:  # the criterion: every part within 15 % of its prediction
            if ms(pr, n) > 0:
                d = ms(me, n) / ms(pr, n) - 1
                checks.append((f"{r['chapter']}: {n} within 15 % of its prediction: {100 * d:+.1f} % "
                               f"({ms(pr, n):.2f} predicted, {ms(me, n):.2f} ms measured)", abs(d) <= 0.15))
    print_table(head2, table2)
    within = [ok for text, ok in checks if "within 15 % of its prediction" in text and ": step " not in text]
    steps = [ok for text, ok in checks if "within 15 % of its prediction" in text and ": step " in text]
    print(f"parts within 15 % of their prediction: {sum(within)} of {len(within)}; "
          f"steps (rank 0's account): {sum(steps)} of {len(steps)}")
print()
for text, ok in checks:
    if isinstance(ok, str):
        print(f"n/a    {text} ({ok[5:]})")
    else:
        print(("ok     " if ok else "MISSED ") + text)
if out:
    json.dump({"cluster": config, "selftest": selftest, "rows": rows,
               "checks": [{"text": t, "ok": ok if isinstance(ok, bool) else None,
                           **({"na": ok[5:]} if isinstance(ok, str) else {})}
                          for t, ok in checks]}, open(out, "w"), indent=1)
