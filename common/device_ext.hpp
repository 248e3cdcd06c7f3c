// device_ext: --device cpu|cuda for every chapter, as a Run extension (common/run.hpp), so it
// costs no line in any main.cpp.
//
// Provides: DeviceExtension. With --device cuda it builds a DeviceTrainer (device_train.hpp)
// from the model after set-up, runs each optimizer step on the GPU instead of the lesson's
// train_step (zero_grad; K micro-batches forward and backward with d loss = 1/K; the NaN guard;
// clipping; the optimizer), and copies the weights back before the driver reads them
// (evaluation, the report, --save-final). That is the step of chapters 01 and 02 for any K.
// Errors (at start-up, on every rank, naming the fix): --device cuda in a distributed chapter
// (03-08 train on the CPU only so far), in a build without CUDA, or with no GPU visible.
// Leaves out: the distributed chapters on the GPU; other extensions that read the model or the
// optimizer state after every step (checkpoints) see the host copy, which --device cuda
// refreshes only before evaluation and the report.
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
  std::string device_ = "cpu";
  std::unique_ptr<DeviceTrainer> trainer_;
};

}  // namespace ringzero
