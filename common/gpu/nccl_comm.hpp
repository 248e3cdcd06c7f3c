// nccl_comm: the optional GPU communicator — the same collectives as comm.hpp, over NCCL on
// CUDA device buffers. Built only with -DRINGZERO_CUDA=ON (scripts/test turns it on when the
// CUDA toolkit and NCCL are found).
//
// Provides: gpu_device_count() (0, never an error, when no driver or device is present, so
// callers can skip cleanly), and NcclCommunicator: one NCCL communicator per MPI rank on
// device local_rank, bootstrapped by broadcasting the ncclUniqueId over MPI (the standard
// NCCL-with-MPI recipe, NCCL docs "Example 2: One device per process"); all_reduce,
// reduce_scatter, all_gather, broadcast on float32 device pointers, with 64-bit counts, and
// byte counters like Communicator's (payload handed to NCCL; its ring/tree is internal).
// Leaves out: the training chapters on GPU (they run on CPU; see docs/multi-node-gpu.md),
// multiple devices per process, streams other than one per communicator.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "common/comm.hpp"

namespace ringzero {

/// Number of visible CUDA devices; 0 when there is no driver, no device, or CUDA fails.
int gpu_device_count(std::string* why = nullptr);

class NcclCommunicator {
 public:
  /// Picks device comm.local_rank() and joins every rank into one NCCL communicator.
  /// Errors: fewer visible devices than local ranks (names both numbers), any CUDA or NCCL
  /// failure (with NCCL's error string). Collective over all ranks of `comm`.
  explicit NcclCommunicator(Communicator& comm);
  ~NcclCommunicator();
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int device() const { return device_; }
  /// In-place sum over ranks of n floats at device pointer buf; returns when complete.
  void all_reduce(float* buf, int64_t n);
  /// in: world_size * n floats, out: n floats (block r of the sum lands on rank r).
  void reduce_scatter(const float* in, float* out, int64_t n);
  /// in: n floats, out: world_size * n floats (block r from rank r).
  void all_gather(const float* in, float* out, int64_t n);
  void broadcast(float* buf, int64_t n, int root);

  const std::map<std::string, Communicator::Counters>& counters() const { return counters_; }

 private:
  void synchronize();
  Communicator& comm_;
  int device_ = -1;
  void* nccl_ = nullptr;    // ncclComm_t
  void* stream_ = nullptr;  // cudaStream_t
  std::map<std::string, Communicator::Counters> counters_;
};

}  // namespace ringzero
