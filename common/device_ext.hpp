// device_ext: --device cpu|emulated|cuda for every chapter, as a Run extension
// (common/run.hpp), so it costs no line in any main.cpp.
//
// Provides: DeviceExtension.
//   the chapter's own train_step (chapters 01-02 on cuda; 01-05 on emulated, whose lessons'
//     runs_on_device() is true): the model moves to the device (Model::to) before the lesson
//     is built, so the lesson's buffers are allocated there, and every op, optimizer update and
//     reduction add runs through the device's backend (common/device_backend.hpp; the
//     optimizer state follows the parameters; the communicator stages messages through host
//     memory); evaluation between epochs runs there too, and the model comes back to the host
//     after the last step.
//   chapters 03-08 on cuda: a DeviceParallel (common/gpu/device_parallel.cpp) runs each step instead of
//     the lesson's train_step, doing the chapter's communication on device buffers, planned
//     here from the lesson's description (--collectives, the buckets, ZeRO's padded layout),
//     over --gpu-transport nccl (one GPU per rank), staged (MPI through pinned host memory:
//     ranks may share a GPU) or auto (nccl when every rank has its own GPU). The weights go
//     back into the lesson's own buffers (its training_state pieces) before the driver reads
//     them (evaluation, the report, --save-final). Issue 27 replaces it by the chapters' code.
// Errors (at start-up, on every rank, naming the fix): a build without CUDA, no GPU visible,
// and flags the device path does not carry yet (checkpoints, --precision bf16|fp16,
// --save-optimizer-state; --device emulated in chapters 03-08). --trace records the GPU's two
// streams (device_parallel.cpp).
// Leaves out: the optimizer state never comes back to the host (hence the refusals).
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
  void before_lesson(RunState& state) override;
  void after_setup(RunState& state) override;
  std::optional<double> train_step_instead(RunState& state, const Step& step) override;
  void before_model_read(RunState& state) override;
  void report(RunState& state, nlohmann::json& summary) override;

 private:
  std::string device_ = "cpu", transport_ = "auto";
  CLI::App* app_ = nullptr;
  bool model_on_device_ = false;  // Model::to(--device): the chapter's own train_step
  std::string device_name_;
  std::unique_ptr<DeviceParallel> parallel_;
};

}  // namespace ringzero
