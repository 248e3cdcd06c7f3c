// device_comm: the communicator's interface on float32 DEVICE buffers, two transports.
//
// Provides: DeviceComm (point-to-point sendrecv and the collectives all_reduce, reduce_scatter,
// all_gather, broadcast, with the same shapes and byte counters as Communicator in
// common/comm.hpp), and its two implementations:
//   NcclCommunicator (nccl_comm.hpp): NCCL on one GPU per rank; sendrecv is ncclSend + ncclRecv
//     inside ncclGroupStart/End (NCCL docs, "Point-to-point communication": a group makes the
//     pair one operation, so a ring cannot deadlock), collectives are ncclAllReduce etc.
//   StagedCommunicator (staged_comm.hpp): copy to pinned host memory, the MPI Communicator,
//     copy back. Slower (two PCIe copies per message) but any number of ranks can share one
//     GPU, which NCCL refuses (it needs a distinct device per rank).
// Counters: what each call hands the transport, counted exactly as Communicator counts it:
// sendrecv counts one message each way of its length; collectives count their payload.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "common/comm.hpp"

namespace ringzero {

class DeviceComm {
 public:
  virtual ~DeviceComm() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  /// Sends n_send floats at device pointer send_buf to dest while receiving n_recv floats from
  /// src into recv_buf; returns when both are complete.
  virtual void sendrecv(const float* send_buf, int64_t n_send, int dest, float* recv_buf,
                        int64_t n_recv, int src) = 0;
  /// In-place sum over ranks of n floats.
  virtual void all_reduce(float* buf, int64_t n) = 0;
  /// in: world_size * n floats, out: n floats (block r of the sum lands on rank r).
  virtual void reduce_scatter(const float* in, float* out, int64_t n) = 0;
  /// in: n floats, out: world_size * n floats (block r from rank r).
  virtual void all_gather(const float* in, float* out, int64_t n) = 0;
  virtual void broadcast(float* buf, int64_t n, int root) = 0;
  /// Per operation: calls, messages and bytes, as Communicator::counters().
  virtual std::map<std::string, Communicator::Counters> counters() const = 0;
  /// "nccl" or "staged-mpi".
  virtual std::string transport() const = 0;
};

}  // namespace ringzero
