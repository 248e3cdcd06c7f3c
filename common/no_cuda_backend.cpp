// Built instead of common/gpu/cuda_backend.cpp when -DRINGZERO_CUDA=OFF: --device cuda fails with
// the fix. (Its own file: tests/emul links no_cuda.cpp's neighbours' replacements, not this.)
#include "check.hpp"
#include "device_backend.hpp"

namespace ringzero {

DeviceBackend& cuda_backend() {
  fail(__FILE__, __LINE__,
       "--device cuda: this build has no CUDA path; reconfigure with cmake --preset release "
       "-DRINGZERO_CUDA=ON (needs the CUDA toolkit and NCCL), or run with --device cpu or "
       "--device emulated");
}

}  // namespace ringzero
