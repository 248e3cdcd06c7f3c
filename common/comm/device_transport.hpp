// device_transport: what moves a message whose buffers live on a device, below the
// Communicator (comm.hpp), so that every chapter's collectives and ring hops run unchanged on
// device memory: PyTorch's DDP runs one reducer over gloo or NCCL the same way (its
// ProcessGroup), needle's backends sit below one array the same way.
//
// Provides: DeviceTransport, the interface (a sendrecv of bytes, and the float32 collectives
// with comm.hpp's shapes), and nccl_transport_factory(), which a CUDA build sets to NCCL's
// (common/device/gpu/nccl_transport.cpp, registered by register_nccl.cpp). The Communicator
// counts every message itself, before it hands it to the transport, so a run's traffic table is
// the same whichever moves the bytes; a transport counts nothing.
// Every other message goes through MPI: host buffers, a message mixing host and device buffers,
// and every message when no transport is set (the emulated device, --device-comm mpi), a device
// buffer staged through host memory (mpi_stage.hpp's HostStage).
// Leaves out: 16-bit sums (the chapters' 16-bit reductions are chapter 04's ring, over sendrecv).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/core/device_memory.hpp"

namespace ringzero {

class Communicator;

/// Moves messages between ranks' device buffers. Every call is collective or paired as the
/// Communicator call that makes it (comm.hpp); it returns when the device buffers it was given
/// may be read or reused. Errors: the transport's own (named, with the fix), as RZ_CHECK.
class DeviceTransport {
 public:
  virtual ~DeviceTransport() = default;
  /// The transport's name, for the banner and the metrics ("nccl").
  virtual std::string name() const = 0;
  /// Whose memory it moves: messages whose buffers all live there go through it.
  virtual Device device() const = 0;
  /// Sends send_bytes at `send` to rank dest while receiving recv_bytes from rank src into
  /// `recv`, both at once (a ring cannot deadlock); a side of 0 bytes does nothing.
  virtual void sendrecv(const void* send, int64_t send_bytes, int dest, void* recv,
                        int64_t recv_bytes, int src) = 0;
  /// n float32 of root's buf into every rank's buf.
  virtual void broadcast(float* buf, int64_t n, int root) = 0;
  /// Sum over ranks of n float32, in place.
  virtual void all_reduce(float* buf, int64_t n) = 0;
  /// in: world_size·n float32; out: n, block r of the sum on rank r.
  virtual void reduce_scatter(const float* in, float* out, int64_t n) = 0;
  /// in: n float32; out: world_size·n, block r from rank r (in may be out + rank·n).
  virtual void all_gather(const float* in, float* out, int64_t n) = 0;
};

/// Makes the transport of a process (collective over every rank of comm).
using TransportFactory = std::unique_ptr<DeviceTransport> (*)(Communicator& comm);
/// NCCL's factory in a CUDA build (register_nccl.cpp sets it before main), else null.
TransportFactory& nccl_transport_factory();

}  // namespace ringzero
