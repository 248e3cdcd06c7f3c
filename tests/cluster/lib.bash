# Shared by the cluster tests (sourced; ctest sets BIN, COMPARE, SRC, MPIRUN). Each test brings
# up its own cluster under its own name and subnet (CLUSTER, CLUSTER_SUBNET: scripts/cluster),
# so a learner's cluster "rz" on 10.77.0.0/24 is never touched, and takes it down on exit.
set -euo pipefail
: "${BIN:?set BIN to the directory of the chapter binaries, or run through ctest}"
: "${SRC:?set SRC to the repository root, or run through ctest}"
CLUSTER_SCRIPT=$SRC/scripts/cluster
export BUILD=${BIN%/bin}
# Skipped (exit 77, ctest "Skipped") with the reason where the cluster cannot be made.
if [ "$(id -u)" -ne 0 ]; then
  echo "SKIPPED: the cluster tests need root (network namespaces, veth, tc); CI runs as root"
  exit 77
fi
for tool in ip tc; do
  if ! command -v "$tool" >/dev/null; then
    echo "SKIPPED: the cluster tests need '$tool' from iproute2 (apt-get install iproute2)"
    exit 77
  fi
done
WORK=$(mktemp -d)
trap '"$CLUSTER_SCRIPT" down >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT
