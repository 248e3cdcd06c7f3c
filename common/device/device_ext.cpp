#include "common/device/device_ext.hpp"

#include <algorithm>

#include "common/core/check.hpp"
#include "common/comm/comm.hpp"
#include "common/core/device_backend.hpp"

namespace ringzero {

namespace {

// The flag `name` was given (an option a chapter may not have: false then).
bool given(CLI::App* app, const std::string& name) {
  const CLI::Option* option = app ? app->get_option_no_throw(name) : nullptr;
  return option != nullptr && option->count() > 0;
}

}  // namespace

void DeviceExtension::add_flags(CommandLine& cli) {
  app_ = &cli.app;
  cli.app
      .add_option("--device", device_,
                  "cpu | emulated | cuda: where the training step runs (cuda: a CUDA build and a "
                  "GPU; emulated: the device backend on the CPU, whose memory host code cannot "
                  "touch)")
      ->check(CLI::IsMember({"cpu", "emulated", "cuda"}));
  cli.app
      .add_option("--device-comm", device_comm_,
                  "nccl | mpi: how messages between device buffers travel (nccl: NCCL on the "
                  "GPUs, the default with --device cuda; mpi: MPI, staged through host memory, "
                  "the emulated device's only way)")
      ->check(CLI::IsMember({"nccl", "mpi"}));
  // Before the lesson's run_instead (chapter 04's benchmark runs instead of training, ahead of
  // validate): the benchmark measures host buffers, not the GPU.
  cli.app.parse_complete_callback([this] {
    if (device_ != "cpu" && given(app_, "--bench-allreduce"))
      throw CLI::ValidationError(
          "--device " + device_ +
          " with --bench-allreduce: the benchmark measures host buffers (ours vs MPI_Allreduce); "
          "NCCL's bus bandwidth on the GPU is build-cuda/tests/gpu_comm_check "
          "(scripts/gpu-check). Drop --device " +
          device_);
  });
}

DeviceExtension::~DeviceExtension() {
  if (transport_) comm_->set_device_transport(nullptr);
}

void DeviceExtension::validate(const RunState& state) {
  if (device_comm_.empty()) return;
  RZ_CHECK(device_ != "cpu", "--device-comm "
                                 << device_comm_
                                 << " with --device cpu: host buffers' messages always "
                                    "go through MPI; drop --device-comm, or run on "
                                    "--device cuda or emulated");
  RZ_CHECK(state.comm != nullptr, "--device-comm " << device_comm_ << ": chapter "
                                                   << state.chapter.name
                                                   << " runs on one process and sends no messages; "
                                                      "drop --device-comm");
  RZ_CHECK(device_comm_ == "mpi" || device_ == "cuda",
           "--device-comm nccl with --device "
               << device_
               << ": NCCL moves GPU memory only; use --device cuda, or drop --device-comm (the "
                  "emulated device stages through MPI)");
}

void DeviceExtension::before_lesson(RunState& state) {
  // The chapter's own train_step on the device's backend: the model moves before the lesson
  // exists, so the lesson's buffers are allocated where the model lives.
  if (device_ == "cpu") return;
  const Device device = parse_device(device_);
  state.model->to(device);
  model_on_device_ = true;
  device_name_ = backend(device).name();
  // NCCL under the communicator, before the lesson's first message (collective: every rank).
  if (device_ != "cuda" || state.comm == nullptr || device_comm_ == "mpi") return;
  // A CUDA build always has NCCL's; the CPU emulation of the CUDA layer has it only where the
  // NCCL headers were found (tests/CMakeLists.txt), and stages otherwise.
  if (nccl_transport_factory() == nullptr && device_comm_.empty()) return;
  RZ_CHECK(nccl_transport_factory() != nullptr,
           "--device-comm nccl: this build has no NCCL transport; drop --device-comm nccl");
  comm_ = state.comm;
  transport_ = nccl_transport_factory()(*comm_);
  comm_->set_device_transport(transport_.get());
}

// How this run's messages between device buffers travel, as the banner and the summary say it.
std::string DeviceExtension::messages() const {
  return transport_ ? "messages over " + transport_->name() + " on the device"
                    : "messages staged through host memory";
}

void DeviceExtension::after_setup(RunState& state) {
  if (!model_on_device_) return;
  print0("device " + device_name_ + " | the chapter's train_step on the device backend" +
         (device_ == "cuda" ? " (cuBLAS SGEMM, TF32 off)" : "") +
         (state.chapter.distributed ? " | " + messages() : std::string()));
}

void DeviceExtension::report(RunState& state, nlohmann::json& summary) {
  if (!model_on_device_) return;
  summary["device"] = device_name_;
  if (state.comm != nullptr) summary["device_comm"] = transport_ ? transport_->name() : "mpi";
  // model_states_bytes_per_rank is the host column's peak (what stayed there: the model before
  // it moved, or, after a ZeRO lesson resets the peaks, its optimizer state until the first
  // step moves it); the device's is the device column's, the largest over ranks.
  double device_states = 0;
  if (summary.contains("ledger"))
    for (const auto& ledger : summary["ledger"])
      if (ledger.contains("device"))
        device_states = std::max(device_states, ledger["device"].value("model_states_peak", 0.0));
  summary["device_model_states_bytes_per_rank"] = device_states;
}

}  // namespace ringzero
