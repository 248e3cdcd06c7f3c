// device_ext: --device cpu|cuda for every chapter, as a Run extension (common/run.hpp), so it
// costs no line in any main.cpp.
//
// Provides: DeviceExtension. With --device cuda it runs each optimizer step on the GPU instead
// of the lesson's train_step, and copies the weights back before the driver reads them
// (evaluation, the report, --save-final):
//   chapters 01-02: a DeviceTrainer (device_train.hpp): zero_grad; K micro-batches forward and
//     backward with d loss = 1/K; the NaN guard; clipping; the optimizer.
//   chapters 03-08: a DeviceParallel (common/gpu/device_parallel.cpp) doing the chapter's
//     communication on device buffers, planned here from the chapter and its lesson object
//     (--collectives, the buckets, ZeRO's padded layout from the lesson's training_state), over
//     --gpu-transport nccl (one GPU per rank), staged (MPI through pinned host memory: ranks may
//     share a GPU) or auto (nccl when every rank has its own GPU). The weights go back into
//     the lesson's own buffers (its training_state pieces), where its evaluation reads them.
// Errors (at start-up, on every rank, naming the fix): a build without CUDA, no GPU visible,
// and flags the GPU path does not carry yet (checkpoints, --precision bf16|fp16,
// --save-optimizer-state). --trace records the GPU's two streams (device_parallel.cpp).
// Leaves out: the host copy of the optimizer state is never refreshed (hence the refusals).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "device_train.hpp"
#include "run.hpp"

namespace ringzero {

class DeviceExtension : public Extension {
 public:
  void add_flags(CommandLine& cli) override;
  void validate(const RunState& state) override;
  void after_setup(RunState& state) override;
  std::optional<double> train_step_instead(RunState& state, const Step& step) override;
  void before_model_read(RunState& state) override;
  void report(RunState& state, nlohmann::json& summary) override;

 private:
  std::string device_ = "cpu", transport_ = "auto";
  CLI::App* app_ = nullptr;
  std::unique_ptr<DeviceTrainer> trainer_;
  std::unique_ptr<DeviceParallel> parallel_;
};

}  // namespace ringzero
