// staged_comm: DeviceComm over MPI through pinned host memory (see device_comm.hpp).
//
// Each call copies the device data into a pinned (page-locked, cudaMallocHost) host buffer, runs
// the very Communicator call of the CPU path on it, and copies the result back: the byte
// counters are the CPU's by construction. It calls the CUDA runtime only through
// common/gpu/device.hpp, so the CPU emulation of that layer (tests/emul) runs it unchanged. What it costs: one device-to-host and one host-to-
// device copy per call, on top of MPI. What it buys: N ranks on one GPU (NCCL needs one GPU per
// rank), and a transport that works wherever MPI does.
// Leaves out: CUDA-aware MPI (passing device pointers to MPI directly), overlap of the copies.
#pragma once

#include "common/gpu/device_comm.hpp"

namespace ringzero {

class StagedCommunicator final : public DeviceComm {
 public:
  /// comm must outlive this. Uses the current CUDA device.
  explicit StagedCommunicator(Communicator& comm) : DeviceComm(comm), comm_(comm) {}
  ~StagedCommunicator() override;
  StagedCommunicator(const StagedCommunicator&) = delete;
  StagedCommunicator& operator=(const StagedCommunicator&) = delete;

  void send(const float* buf, int64_t n, int dest) override;
  void recv(float* buf, int64_t n, int src) override;
  using DeviceComm::sendrecv;
  void sendrecv(const float* send_buf, int64_t n_send, int dest, float* recv_buf, int64_t n_recv,
                int src) override;
  void all_reduce(float* buf, int64_t n) override;
  void reduce_scatter(const float* in, float* out, int64_t n) override;
  void all_gather(const float* in, float* out, int64_t n) override;
  void broadcast(float* buf, int64_t n, int root) override;
  std::string transport() const override { return "staged-mpi"; }

 private:
  float* host(int64_t n);  // the pinned staging buffer, grown to at least n floats
  Communicator& comm_;
  float* host_ = nullptr;
  int64_t host_size_ = 0;
};

}  // namespace ringzero
