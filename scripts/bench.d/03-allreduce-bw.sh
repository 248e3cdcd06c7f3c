#!/usr/bin/env bash
# Ring all-reduce (chapter 04, ring.hpp) against Open MPI's MPI_Allreduce, bus bandwidth from
# 4 KiB to 64 MiB on NP ranks (default 2), both measured in the same process and run
# (ch04_ring_allreduce --bench-allreduce; nccl-tests definitions: algbw = S/t, busbw = algbw ·
# 2(N-1)/N). Goal: ours >= 0.9x MPI_Allreduce's busbw at every size >= 1 MiB.
# Then, clearly labelled and only when mpicc is there: the peer program
# bench/peers/mpi_allreduce_bw.c (MPI_Allreduce alone, its own timing loop) as a
# cross-check of the MPI column. It is compiled into a temporary directory, never into the
# project.
#   BUILD=build-foo NP=4 scripts/bench.d/03-allreduce-bw.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
NP=${NP:-2}
CH04="$BUILD/bin/ch04_ring_allreduce"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ -x "$CH04" ] || { echo "skipped: $CH04 not built (scripts/bench builds it)"; exit 0; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

mpirun -np "$NP" --oversubscribe "$CH04" --bench-allreduce | tee "$TMP/table.txt"
# Columns: bytes | ring us algbw busbw | mpi us algbw busbw | ring/mpi (ring/mpi = t_mpi / t_ring).
awk -F'|' '$1 + 0 >= 1048576 {
    n++; r = $4 + 0; if (min == "" || r < min) min = r
  } END {
    if (n == 0) { print "no sizes >= 1 MiB in the table"; exit 1 }
    printf "goal: ring busbw >= 0.90x MPI_Allreduce at >= 1 MiB: worst ratio %.2f -> %s\n", min, (min >= 0.9 ? "MET" : "NOT MET")
  }' "$TMP/table.txt"

PEER="$(git rev-parse --show-toplevel)/bench/peers/mpi_allreduce_bw.c"
if command -v mpicc >/dev/null && [ -f "$PEER" ]; then
  echo
  echo "cross-check (peer program bench/peers/mpi_allreduce_bw.c, MPI_Allreduce alone, not part of RingZero):"
  mpicc -O2 "$PEER" -o "$TMP/peer_bw"
  mpirun -np "$NP" --oversubscribe "$TMP/peer_bw"
else
  echo "(cross-check skipped: mpicc or $PEER not found)"
fi
