#include "device_ext.hpp"

#include <algorithm>

#include "check.hpp"
#include "device_backend.hpp"
#include "collectives.hpp"
#include "engine_description.hpp"

namespace ringzero {

namespace {

// The flag `name` was given (an option a chapter may not have: false then).
bool given(CLI::App* app, const std::string& name) {
  const CLI::Option* option = app ? app->get_option_no_throw(name) : nullptr;
  return option != nullptr && option->count() > 0;
}

// What the chapter's step does on the GPU, from its lesson's description
// (common/engine_description.hpp): the collectives; a central reducer (03), one all-reduce per
// parameter (04), DDP's buckets (05: the sizes it posts, backward order, tiling the model from
// its end), or ZeRO's stage, prefetch and units with their padding (06-08). Issue 27 replaces
// this planner by the chapters' own code on a device backend.
DevicePlan plan_for(const RunState& state) {
  const std::optional<EngineDescription> d = state.lesson->description();
  RZ_CHECK(d, "--device cuda: chapter " << state.chapter.name << " has no GPU step");
  DevicePlan plan;
  plan.ring = d->collectives == Collectives::ring;
  if (d->central) {
    plan.kind = DevicePlan::Kind::central;
    return plan;
  }
  if (d->zero_stage == 0 && d->unit == "parameters") {
    plan.kind = DevicePlan::Kind::all_reduce;
    return plan;
  }
  if (d->zero_stage == 0) {
    plan.kind = DevicePlan::Kind::buckets;
    int64_t end = state.model->num_parameters();
    for (int64_t n : d->unit_sizes) {
      plan.ranges.push_back({end - n, n, 0});
      end -= n;
    }
    RZ_CHECK(end == 0, "DDP's buckets cover " << state.model->num_parameters() - end << " of "
                                              << state.model->num_parameters() << " parameters");
    return plan;
  }
  plan.kind = DevicePlan::Kind::zero;
  plan.zero_stage = d->zero_stage;
  plan.prefetch = d->prefetch.value_or(true);
  for (const ShardUnit& u : d->units)
    plan.ranges.push_back({u.offset, u.size, d->world_size * u.shard_size - u.size});
  return plan;
}

}  // namespace

void DeviceExtension::add_flags(CommandLine& cli) {
  app_ = &cli.app;
  cli.app
      .add_option("--device", device_,
                  "cpu | emulated | cuda: where the training step runs (cuda: a CUDA build and a "
                  "GPU; emulated: the device backend on the CPU, whose memory host code cannot "
                  "touch, chapters 01-05)")
      ->check(CLI::IsMember({"cpu", "emulated", "cuda"}));
  cli.app
      .add_option("--gpu-transport", transport_,
                  "auto | nccl | staged: --device cuda's communication (nccl: one GPU per rank; "
                  "staged: MPI through pinned host memory, ranks may share a GPU; auto: nccl when "
                  "every rank has its own GPU; chapters 03-08)")
      ->check(CLI::IsMember({"auto", "nccl", "staged"}));
  // Before the lesson's run_instead (chapter 04's benchmark runs instead of training, ahead of
  // validate): the benchmark measures host buffers, not the GPU.
  cli.app.parse_complete_callback([this] {
    if (device_ != "cpu" && given(app_, "--bench-allreduce"))
      throw CLI::ValidationError(
          "--device " + device_ +
          " with --bench-allreduce: the benchmark measures host buffers (ours vs MPI_Allreduce); "
          "NCCL's bus bandwidth on the GPU is build-cuda/tests/gpu_nccl_check "
          "(scripts/gpu-check). Drop --device " + device_);
  });
}

void DeviceExtension::validate(const RunState& state) {
  RZ_CHECK(transport_ == "auto" || state.chapter.distributed,
           "--gpu-transport " << transport_ << ": chapter " << state.chapter.name
                              << " runs one process and communicates nothing; drop "
                                 "--gpu-transport");
  RZ_CHECK(device_ == "cuda" || transport_ == "auto",
           "--gpu-transport " << transport_ << " without --device cuda: add --device cuda, or "
                                               "drop --gpu-transport");
  RZ_CHECK(!collectives_nccl_requested() || (device_ == "cuda" && transport_ != "staged"),
           "--collectives nccl"
               << (device_ == "cuda" ? " with --gpu-transport staged" : " without --device cuda")
               << ": NCCL's collectives run on GPU buffers over the NCCL transport; add --device "
                  "cuda (with --gpu-transport nccl or auto), or use --collectives mpi");
  RZ_CHECK(device_ != "emulated" || state.lesson_on_device,
           "--device emulated: chapter " << state.chapter.name
                                         << "'s engine does not run on the device backend yet "
                                            "(its shard buffers are host loops; chapters 01-05 "
                                            "run there); use --device cpu");
  if (device_ == "cpu") return;
  // Checked here, before after_setup probes the GPU, so a build or machine without one gives
  // these messages too. The device keeps the weights and optimizer state in device buffers: a
  // checkpoint would read host buffers that are stale (03-08) or not there (01-02).
  const TrainConfig& c = state.config;
  const std::string checkpoint_flag =
      c.resume.empty() ? "--checkpoint-dir " + c.checkpoint_dir : "--resume " + c.resume;
  RZ_CHECK(c.checkpoint_dir.empty() && c.resume.empty(),
           "--device " << device_ << " with " << checkpoint_flag
                       << ": the device path cannot save or resume its training state yet "
                          "(checkpoints hold the CPU state only). Drop --checkpoint-dir/--resume, "
                          "or use --device cpu");
  // 16-bit storage (common/mixed.hpp) has no device operations yet.
  RZ_CHECK(c.precision == "fp32",
           "--device " << device_ << " with --precision " << c.precision
                        << ": the device path trains in fp32 only so far. Drop --precision (or "
                           "use --precision fp32), or use --device cpu for 16-bit training");
  RZ_CHECK(!given(app_, "--find-unused-parameters"),
           "--device " << device_
                       << " with --find-unused-parameters: the GPU step runs the model's every "
                          "layer and has no unused-parameter pass. Drop --find-unused-parameters, "
                          "or use --device cpu");
  RZ_CHECK(!given(app_, "--save-optimizer-state"),
           "--device " << device_
                       << " with --save-optimizer-state: the optimizer state stays on the device "
                          "and is not written back yet. Drop --save-optimizer-state, or use "
                          "--device cpu");
}

void DeviceExtension::before_lesson(RunState& state) {
  // The chapter's own train_step on the device's backend: the model moves before the lesson
  // exists, so the lesson's buffers are allocated where the model lives. (--device cuda in
  // chapters 03-08 still runs DeviceParallel from the host model, in after_setup.)
  if (device_ == "cpu" || (device_ == "cuda" && state.chapter.distributed)) return;
  const Device device = parse_device(device_);
  state.model->to(device);
  model_on_device_ = true;
  device_name_ = backend(device).name();
}

void DeviceExtension::after_setup(RunState& state) {
  if (device_ == "cpu") return;
  if (model_on_device_) {
    print0("device " + device_name_ + " | the chapter's train_step on the device backend" +
           (device_ == "cuda" ? " (cuBLAS SGEMM, TF32 off)" : "") +
           (state.chapter.distributed ? " | messages staged through host memory" : ""));
    return;
  }
  DevicePlan plan = plan_for(state);
  plan.transport = transport_;
  plan.nccl_collectives = collectives_nccl_requested();
  const TrainingState host = state.lesson->training_state(*state.model);
  parallel_ = make_device_parallel(*state.model, state.config, *state.comm, plan, host);
  print0("device " + parallel_->device_name() + " | cuBLAS SGEMM, TF32 off | transport " +
         parallel_->transport() + " | " +
         (parallel_->overlaps() && !plan.ring ? "collectives on a communication stream"
                                              : "collectives in line with compute") +
         (parallel_->overlaps() && plan.ring ? " (the ring's hops are host-driven)" : ""));
}

std::optional<double> DeviceExtension::train_step_instead(RunState&, const Step& step) {
  if (parallel_) return parallel_->train_step(step);
  return std::nullopt;
}

void DeviceExtension::before_model_read(RunState& state) {
  // An evaluation between epochs runs on the device (the same ops); after the last step the
  // model comes home for the report and --save-final.
  if (model_on_device_ && state.step >= state.steps) state.model->to(Device::cpu);
  if (parallel_) parallel_->copy_to_host(*state.model, state.lesson->training_state(*state.model));
}

void DeviceExtension::report(RunState&, nlohmann::json& summary) {
  if (!model_on_device_ && !parallel_) return;
  summary["device"] = parallel_ ? parallel_->device_name() : device_name_;
  if (parallel_) summary["device_transport"] = parallel_->transport();
  // model_states_bytes_per_rank is the host's peak (DeviceParallel: the lesson's idle CPU
  // buffers; the chapter's own step: the model before it moved); the device's is the device
  // column's, the largest over ranks.
  double device_states = 0;
  if (summary.contains("ledger"))
    for (const auto& ledger : summary["ledger"])
      if (ledger.contains("device"))
        device_states = std::max(device_states, ledger["device"].value("model_states_peak", 0.0));
  summary["device_model_states_bytes_per_rank"] = device_states;
}

}  // namespace ringzero
