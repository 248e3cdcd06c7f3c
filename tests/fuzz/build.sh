#!/usr/bin/env bash
# Builds the libFuzzer targets with Debian's clang (packages clang, libclang-rt-14-dev):
#   tests/fuzz/build.sh OUT_DIR
# Compiles the few common/ sources the three readers need once, with
# -fsanitize=fuzzer-no-link,address,undefined, and links fuzz_safetensors, fuzz_idx and
# fuzz_manifest (the checkpoint reader, checkpoint_read.cpp and checkpoint_manifest.cpp).
# nn.cpp's Linear reaches the 16-bit path (ops.cpp: linear_half), which reaches the optimizer,
# the communicator, metrics, train and config: ASan's global metadata keeps every vtable, so
# those are linked too although the parsers never call them; ops and optim reach the device
# backends (device, emulated_device; the CUDA one is never registered here).
# Called by CMake (target fuzz_targets) when clang++ and libFuzzer are present.
set -euo pipefail
out=$1
src=$(cd "$(dirname "$0")/../.." && pwd)
CXX=${FUZZ_CXX:-clang++}
launcher=()
if command -v ccache >/dev/null; then launcher=(ccache); fi
mkdir -p "$out/obj"
read -r -a mpi_compile <<<"$(mpicxx --showme:compile)"
read -r -a mpi_link <<<"$(mpicxx --showme:link)"
flags=(-std=c++20 -O1 -g -fno-omit-frame-pointer -fno-sanitize-recover=undefined
       -I"$src" -I/usr/include/eigen3 "${mpi_compile[@]}")
objs=()
sources=(core/check core/tensor core/ledger core/autograd core/ops core/nn core/half core/optim
         core/device_backend data/data io/safetensors io/atomic_file io/checkpoint_read
         io/checkpoint_manifest precision/mixed comm/comm comm/comm_collectives comm/comm_wait comm/mpi_stage
         report/metrics driver/train driver/config core/emulated_device core/step core/step_time)
for f in "${sources[@]}"; do
  o="$out/obj/${f//\//_}.o"
  "${launcher[@]}" "$CXX" "${flags[@]}" -fsanitize=fuzzer-no-link,address,undefined \
    -c "$src/common/$f.cpp" -o "$o"
  objs+=("$o")
done
for t in fuzz_safetensors fuzz_idx fuzz_manifest; do
  "${launcher[@]}" "$CXX" "${flags[@]}" -fsanitize=fuzzer,address,undefined \
    -c "$src/tests/fuzz/$t.cpp" -o "$out/obj/$t.o"
  "$CXX" -fsanitize=fuzzer,address,undefined "$out/obj/$t.o" "${objs[@]}" -lz \
    "${mpi_link[@]}" -o "$out/$t"
done
