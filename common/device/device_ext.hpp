// device_ext: --device cpu|emulated|cuda for every chapter, as a Run extension
// (common/driver/run.hpp), so it costs no line in any main.cpp.
//
// Provides: DeviceExtension. With --device emulated or cuda, every chapter runs its own
// train_step on the device: the model moves there (Model::to) before the lesson is built, so the
// lesson's buffers are allocated where the model lives (an engine asks model.device()), and
// every op, optimizer update, reduction add and copy runs through the device's backend
// (common/core/device_backend.hpp: emulated, or cuda over kernels.cu and cuBLAS); the optimizer
// state follows the parameters. Messages between device buffers go over NCCL on --device cuda
// (the Communicator's device transport, common/comm/device_transport.hpp), or, on the emulated
// device and with --device-comm mpi, are staged through host memory (common/comm/comm.cpp);
// either way the counters and the ring's hops are the CPU run's. Evaluation runs there too; the
// report and --save-final copy what they read to the host.
// 16-bit precision (--precision bf16|fp16, --reduce-dtype), checkpoints, --save-optimizer-state
// and --find-unused-parameters are the CPU's code there too: 16-bit storage converts through the
// backend (common/core/half.cpp), the checkpoint's writer and reader copy with copy_elements.
// Errors (at start-up, on every rank, naming the fix): a build without CUDA, no GPU visible,
// --bench-allreduce (it measures host buffers), --device-comm on --device cpu or in a chapter of
// one process (01, 02), --device-comm nccl off --device cuda.
// Leaves out: a communication stream that no host thread waits for (comm/device_transport.hpp).
#pragma once

#include <memory>
#include <string>

#include "common/comm/device_transport.hpp"
#include "common/driver/run.hpp"

namespace ringzero {

class DeviceExtension : public Extension {
 public:
  /// Takes the device transport off the communicator (which outlives us) before it goes.
  ~DeviceExtension() override;
  void add_flags(CommandLine& cli) override;
  void validate(const RunState& state) override;
  void before_lesson(RunState& state) override;
  void after_setup(RunState& state) override;
  void report(RunState& state, nlohmann::json& summary) override;

 private:
  std::string device_ = "cpu";
  CLI::App* app_ = nullptr;
  bool model_on_device_ = false;  // Model::to(--device) done
  std::string messages() const;   // how messages between device buffers travel, in words
  std::string device_name_;       // the backend's name(): "NVIDIA H200", "emulated ..."
  std::string device_comm_;       // --device-comm: nccl | mpi | "" (nccl on cuda, else mpi)
  Communicator* comm_ = nullptr;
  std::unique_ptr<DeviceTransport> transport_;  // NCCL under comm_ (--device cuda, chapters 03-08)
};

}  // namespace ringzero
