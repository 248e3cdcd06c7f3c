// Built instead of common/gpu/ when -DRINGZERO_CUDA=OFF: --device cuda fails with the fix.
#include "check.hpp"
#include "device_train.hpp"

namespace ringzero {

std::unique_ptr<DeviceTrainer> make_device_trainer(const Model&, const TrainConfig&, int) {
  fail(__FILE__, __LINE__,
       "--device cuda: this build has no CUDA path; reconfigure with cmake --preset release "
       "-DRINGZERO_CUDA=ON (needs the CUDA toolkit and NCCL), or run with --device cpu");
}

}  // namespace ringzero
