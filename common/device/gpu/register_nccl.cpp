// register_nccl: makes --device cuda's messages go over NCCL. Compiled into every executable
// that links ringzero_device in a CUDA build, beside register_cuda.cpp (and so for the same
// reason): before main it sets nccl_transport_factory() (common/comm/device_transport.hpp) to
// make_nccl_transport (nccl_transport.cpp).
#include "common/device/gpu/nccl_transport.hpp"

namespace ringzero {
namespace {

const bool registered = (nccl_transport_factory() = &make_nccl_transport, true);

}  // namespace
}  // namespace ringzero
