#!/usr/bin/env bash
# The emulated network is fast and shaped as configured (scripts/cluster selftest, per link of
# the ring of nodes, one rank per node):
#  - unshaped, 2 nodes: small-message latency (8 B one-way, best of 10 medians of 200 round
#    trips) <= 100 µs. Without mpi_yield_when_idle it is ~4000 µs, one scheduler tick
#    (docs/multi-node-gpu.md); measured with it on a quiet 2-core machine: 12-13 µs, so the
#    bound leaves room for a busy machine and still catches the tick;
#  - 1 gbit, 4 nodes: latency <= 100 µs and every link's bandwidth (4 MiB ping-pong) within
#    10 % of 1 Gbit/s (the issue's bound; measured 99-101 %: jumbo frames leave 0.7 % to
#    headers, the token bucket's 1 ms burst adds at most 3 %).
# And `down` leaves nothing behind: no namespace, link or state of this cluster, also when `up`
# failed half-way (a namespace of node 1's name exists already: node 0 and the bridge were made).
export CLUSTER=rzs CLUSTER_SUBNET=10.77.2
source "$(dirname "$0")/lib.bash"

# nothing_left WHEN: no namespace, link or state of this cluster remains.
nothing_left() {
  local left links
  left=$(ip netns list | grep -c "^$CLUSTER-" || true)
  links=$(ip -o link show | grep -c " $CLUSTER-" || true)
  if [ "$left" != 0 ] || [ "$links" != 0 ] || [ -e "/run/ringzero-cluster/$CLUSTER" ]; then
    echo "FAILED: $1 left $left namespaces, $links links of cluster $CLUSTER"; exit 1
  fi
  echo "ok: $1 left no namespace, link or state file"
}

ip netns add "$CLUSTER-n1"
if "$CLUSTER_SCRIPT" up --nodes 3 --slots 1 --bandwidth 1gbit; then
  echo "FAILED: up succeeded although $CLUSTER-n1 existed"; exit 1
fi
nothing_left "a failed up"

"$CLUSTER_SCRIPT" up --nodes 2 --slots 1 --bandwidth none
"$CLUSTER_SCRIPT" selftest --max-latency-us 100
"$CLUSTER_SCRIPT" down

"$CLUSTER_SCRIPT" up --nodes 4 --slots 1 --bandwidth 1gbit
"$CLUSTER_SCRIPT" status
"$CLUSTER_SCRIPT" selftest --max-latency-us 100 --bandwidth-tolerance 0.10
# The ring with every link busy at once (the cost model's fabric): measured, and physical —
# no more than the 4 links at their shaped rate (+5 %: the token bucket's 1 ms burst), and
# more than nothing.
python3 - "/run/ringzero-cluster/$CLUSTER/selftest.json" <<'EOF_PY'
import json, sys
s = json.load(open(sys.argv[1]))
fabric, ring = s["fabric_bps"], s["ring_bandwidth_bps"]
assert abs(fabric - 4 * ring) <= 1e-6 * fabric, (fabric, ring)
assert 0.05e9 < ring <= 1.05e9, "ring bandwidth %.3f Gbit/s per link is outside (0.05, 1.05]" % (ring / 1e9)
print("ok: ring with every link busy: %.3f Gbit/s per link, fabric %.3f Gbit/s" % (ring / 1e9, fabric / 1e9))
EOF_PY
"$CLUSTER_SCRIPT" down

# --comm-core: the layout is recorded, shown, and refused on a 1-core machine with the reason.
"$CLUSTER_SCRIPT" up --nodes 2 --slots 1 --bandwidth none --comm-core
grep -q "^comm_cpus=$(( $(nproc) - 1 ))$" "/run/ringzero-cluster/$CLUSTER/config" ||
  { echo "FAILED: --comm-core did not record the last CPU"; exit 1; }
status=$("$CLUSTER_SCRIPT" status)  # (not piped into grep -q: pipefail would see SIGPIPE)
grep -q "communication threads on CPU $(( $(nproc) - 1 ))" <<<"$status" ||
  { echo "FAILED: status does not show the --comm-core layout: $status"; exit 1; }
"$CLUSTER_SCRIPT" down
if out=$(taskset -c 0 "$CLUSTER_SCRIPT" up --nodes 2 --slots 1 --bandwidth none --comm-core 2>&1); then
  echo "FAILED: --comm-core on one core succeeded"; "$CLUSTER_SCRIPT" down; exit 1
fi
grep -q "needs at least 2 cores" <<<"$out" || { echo "FAILED: no reason given: $out"; exit 1; }
echo "ok: --comm-core recorded, shown, and refused on one core ($out)"

nothing_left "down"
