// Built instead of common/gpu/ when -DRINGZERO_CUDA=OFF: --device cuda fails with the fix.
#include "check.hpp"
#include "device_train.hpp"

namespace ringzero {

namespace {
[[noreturn]] void no_cuda() {
  fail(__FILE__, __LINE__,
       "--device cuda: this build has no CUDA path; reconfigure with cmake --preset release "
       "-DRINGZERO_CUDA=ON (needs the CUDA toolkit and NCCL), or run with --device cpu");
}
}  // namespace

std::unique_ptr<DeviceTrainer> make_device_trainer(const Model&, const TrainConfig&, int,
                                                   DeviceTrainerOptions) {
  no_cuda();
}

std::unique_ptr<DeviceParallel> make_device_parallel(const Model&, const TrainConfig&,
                                                     Communicator&, const DevicePlan&,
                                                     const TrainingState&) {
  no_cuda();
}

}  // namespace ringzero
