#include "device_ext.hpp"

#include "check.hpp"

namespace ringzero {

void DeviceExtension::add_flags(CommandLine& cli) {
  cli.app
      .add_option("--device", device_,
                  "cpu | cuda: where the training step runs (cuda: chapters 01-02, a CUDA build)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
}

void DeviceExtension::validate(const RunState& state) {
  RZ_CHECK(device_ == "cpu" || !state.chapter.distributed,
           "--device " << device_ << ": chapter " << state.chapter.name
                       << " trains on the CPU only so far; chapters 01 and 02 run on cuda "
                          "(docs/multi-node-gpu.md). Use --device cpu");
  // Checked here, before after_setup probes the GPU, so a build or machine without one gives
  // this message too. The GPU step keeps its weights and AdamW moments in device buffers: a
  // checkpoint would save the stale host copy, and a resume would load into the host after
  // the trainer copied the fresh weights over.
  const TrainConfig& c = state.config;
  RZ_CHECK(device_ != "cuda" || (c.checkpoint_dir.empty() && c.resume.empty()),
           "--device cuda with " << (c.resume.empty() ? "--checkpoint-dir " + c.checkpoint_dir
                                                      : "--resume " + c.resume)
                                 << ": the GPU path cannot save or resume its training state yet "
                                    "(checkpoints hold the CPU state only). Drop "
                                    "--checkpoint-dir/--resume, or use --device cpu");
  // The GPU trainer trains fp32 copies of the host weights, which a 16-bit run has released.
  RZ_CHECK(device_ != "cuda" || c.precision == "fp32",
           "--device cuda with --precision " << c.precision
                                             << ": the GPU path trains in fp32 only so far. Drop "
                                                "--precision (or use --precision fp32), or use "
                                                "--device cpu for 16-bit training");
}

void DeviceExtension::after_setup(RunState& state) {
  if (device_ != "cuda") return;
  trainer_ = make_device_trainer(*state.model, state.config);
  print0("device " + trainer_->device_name() + " | cuBLAS SGEMM, TF32 off");
}

// The step of chapters 01-02 (training_loop.hpp, grad_accum.hpp), on the GPU.
std::optional<double> DeviceExtension::train_step_instead(RunState&, const Step& step) {
  if (!trainer_) return std::nullopt;
  const int64_t K = step.config.grad_accum_steps;
  trainer_->zero_grad();  // once per optimizer step; backward accumulates over the K micro-steps
  double loss_sum = 0;
  for (int64_t micro_step = 0; micro_step < K; ++micro_step)
    loss_sum += trainer_->forward_backward(step.micro_batch(micro_step), 1.0f / K);
  const double loss = loss_sum / K;
  check_finite_loss(loss, step.step);
  if (step.config.clip_grad_norm > 0) trainer_->clip_grad_norm(step.config.clip_grad_norm);
  trainer_->step();
  return loss;
}

void DeviceExtension::before_model_read(RunState& state) {
  if (trainer_) trainer_->copy_to_host(*state.model);
}

void DeviceExtension::report(RunState&, nlohmann::json& summary) {
  if (trainer_) summary["device"] = trainer_->device_name();
}

}  // namespace ringzero
