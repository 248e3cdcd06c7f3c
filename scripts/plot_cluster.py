#!/usr/bin/python3
"""The cluster tour's figure: measured vs predicted time per optimizer step, per chapter, from
scripts/cluster-tour's cluster.json (runs/cluster/cluster.json by default).
    python3 scripts/plot_cluster.py [runs/cluster/cluster.json] [docs/cluster_tour.png]
Needs python3-matplotlib (scripts/setup installs it)."""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

src = sys.argv[1] if len(sys.argv) > 1 else "runs/cluster/cluster.json"
dst = sys.argv[2] if len(sys.argv) > 2 else "docs/cluster_tour.png"
data = json.load(open(src))
rows = [r for r in data["rows"] if r.get("predicted_ms")]
names = [r["chapter"].replace("_", " ", 1) for r in rows]
x = range(len(rows))
fig, ax = plt.subplots(figsize=(9, 4.2))
w = 0.38
ax.bar([i - w / 2 for i in x], [r["measured_ms"] for r in rows], w, label="measured (mean of the steps)")
ax.bar([i + w / 2 for i in x], [r["predicted_ms"] for r in rows], w, label="predicted (α-β model)")
for i, r in enumerate(rows):
    ax.text(i, max(r["measured_ms"], r["predicted_ms"]) * 1.02, f"{r['measured_ms'] / r['predicted_ms']:.2f}",
            ha="center", fontsize=8)
ax.set_xticks(list(x))
ax.set_xticklabels(names, rotation=20, ha="right", fontsize=8)
ax.set_ylabel("ms per optimizer step")
c, s = data["cluster"], data["selftest"]
ax.set_title(f"{c['nodes']} nodes x {c['slots']} rank, links {c['bandwidth']}: selftest α {s['latency_us']:.0f} µs, "
             f"β {s['bandwidth_bps'] / 1e9:.2f} Gbit/s"
             + (f", fabric {s['fabric_bps'] / 1e9:.2f} Gbit/s" if "fabric_bps" in s else "")
             + (", --comm-core" if c.get("comm_cpus") else "")
             + " (numbers: measured / predicted)", fontsize=9)
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(dst, dpi=110)
print(f"wrote {dst}")
