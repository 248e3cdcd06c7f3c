// register_cuda: makes --device cuda find the CUDA backend. Compiled into every executable that
// links ringzero_device in a CUDA build (an INTERFACE source of that target, not a member of a
// static library, so its initializer always runs): before main it sets
// cuda_backend_factory() (common/core/device_backend.hpp) to cuda_backend (cuda_backend.cpp). The
// library below (ringzero_common) never names the GPU library, so the two link without a cycle.
#include "common/core/device_backend.hpp"

namespace ringzero {
namespace {

const bool registered = (cuda_backend_factory() = &cuda_backend, true);

}  // namespace
}  // namespace ringzero
