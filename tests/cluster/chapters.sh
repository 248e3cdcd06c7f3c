#!/usr/bin/env bash
# The network changes no number: chapters 03, 05 and 08, run across 4 nodes (one rank each,
# TCP between nodes through Open MPI's rsh launcher and the namespace agent) and across 2 nodes
# of 2 ranks (shared memory within a node, TCP between), and across 4 nodes made with
# --comm-core (communication threads on their own core), end with the same parameters and loss
# history, bit for bit, as the same run on one node (mpirun -np 4, shared memory). Every
# reduction is our own point-to-point code in a fixed order, and the metrics' MPI_Allreduce of
# doubles picks its algorithm by size, not by transport. Links at 8 gbit keep the runs short.
export CLUSTER=rzc CLUSTER_SUBNET=10.77.3
source "$(dirname "$0")/lib.bash"

# runs NAME COMMAND...: one chapter run, its final parameters and metrics kept under $WORK.
runs() {
  local name=$1; shift
  local cmd=("$@" --save-final "$WORK/$name.safetensors" --metrics "$WORK/$name.jsonl" --log-every 1000)
  if ! timeout 120 "${cmd[@]}" >"$WORK/$name.log" 2>&1; then
    echo "FAILED: ${cmd[*]}"; cat "$WORK/$name.log"; exit 1
  fi
}
common=(--model mlp --global-batch-size 64 --max-steps 6 --eval-every-epoch 0 --seed 5)
declare -A extra=([03_data_parallel]="" [05_ddp_buckets]="--bucket-cap-mb 0.25" [08_zero3]="")

for chapter in 03_data_parallel 05_ddp_buckets 08_zero3; do
  # shellcheck disable=SC2206
  flags=("${common[@]}" ${extra[$chapter]})
  runs "${chapter}_one_node" "$MPIRUN" -np 4 --oversubscribe "$BIN/ch$chapter" "${flags[@]}"
done

# across TAG WHAT CHAPTER...: each chapter run on the cluster that is up, compared bit for bit
# with its one-node run.
across() {
  local tag=$1 what=$2 chapter
  shift 2
  for chapter in "$@"; do
    # shellcheck disable=SC2206
    flags=("${common[@]}" ${extra[$chapter]})
    runs "${chapter}_$tag" "$CLUSTER_SCRIPT" run -- "$BIN/ch$chapter" "${flags[@]}"
    echo "== $chapter: $what vs one node"
    "$COMPARE" "$WORK/${chapter}_one_node.safetensors" "$WORK/${chapter}_$tag.safetensors" \
      "$WORK/${chapter}_one_node.jsonl" "$WORK/${chapter}_$tag.jsonl" --bitwise
  done
}

"$CLUSTER_SCRIPT" up --nodes 4 --slots 1 --bandwidth 8gbit
across 4x1 "4 nodes x 1 rank" 03_data_parallel 05_ddp_buckets 08_zero3
"$CLUSTER_SCRIPT" down

"$CLUSTER_SCRIPT" up --nodes 2 --slots 2 --bandwidth 8gbit
across 2x2 "2 nodes x 2 ranks" 05_ddp_buckets
"$CLUSTER_SCRIPT" down

# --comm-core moves threads between cores; it must not move a number.
"$CLUSTER_SCRIPT" up --nodes 4 --slots 1 --bandwidth 8gbit --comm-core
across comm_core "4 nodes x 1 rank with --comm-core" 05_ddp_buckets 08_zero3
