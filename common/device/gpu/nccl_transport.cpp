#include "common/device/gpu/nccl_transport.hpp"

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <cstdio>
#include <string>
#include <vector>

#include "common/core/check.hpp"

namespace ringzero {

namespace {
void check_cuda(cudaError_t rc, const char* call) {
  RZ_CHECK(rc == cudaSuccess, call << " failed: " << cudaGetErrorString(rc));
}
void check_nccl(ncclResult_t rc, const char* call) {
  RZ_CHECK(rc == ncclSuccess,
           call << " failed: " << ncclGetErrorString(rc) << "; set NCCL_DEBUG=INFO for details");
}
#define CUDA_CALL(...) check_cuda((__VA_ARGS__), #__VA_ARGS__)
#define NCCL_CALL(...) check_nccl((__VA_ARGS__), #__VA_ARGS__)

ncclComm_t as_comm(void* p) {
  return static_cast<ncclComm_t>(p);
}
cudaStream_t as_stream(void* p) {
  return static_cast<cudaStream_t>(p);
}
}  // namespace

int gpu_device_count(std::string* why) {
  int n = 0;
  cudaError_t rc = cudaGetDeviceCount(&n);
  if (rc != cudaSuccess) {
    if (why) *why = cudaGetErrorString(rc);
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA device visible";
  return n;
}

namespace {

// Every rank's GPU (host name and PCI bus id), gathered on every rank (MPI_Allgather, as the
// ncclUniqueId's broadcast: set-up, not counted): "" when no two ranks share one, else the first
// two that do, the same text on every rank.
std::string shared_gpu(Communicator& comm, int gpu) {
  constexpr int kName = MPI_MAX_PROCESSOR_NAME + 80;
  std::vector<char> mine(kName, '\0'), all(static_cast<size_t>(kName) * comm.world_size());
  char bus[64] = {};
  CUDA_CALL(cudaDeviceGetPCIBusId(bus, sizeof bus, gpu));
  int len = 0;
  MPI_Get_processor_name(mine.data(), &len);
  std::snprintf(mine.data() + len, static_cast<size_t>(kName - len), " GPU %s", bus);
  MPI_Allgather(mine.data(), kName, MPI_CHAR, all.data(), kName, MPI_CHAR, MPI_COMM_WORLD);
  auto name = [&](int r) { return std::string(all.data() + static_cast<size_t>(r) * kName); };
  for (int a = 0; a < comm.world_size(); ++a)
    for (int b = a + 1; b < comm.world_size(); ++b)
      if (name(a) == name(b))
        return "ranks " + std::to_string(a) + " and " + std::to_string(b) + " both use " + name(a);
  return "";
}

}  // namespace

NcclTransport::NcclTransport(Communicator& comm) {
  // The GPU the backend uses (device.cpp's require_gpu), which every thread of the process uses.
  CUDA_CALL(cudaGetDevice(&gpu_));
  const std::string shared = shared_gpu(comm, gpu_);
  RZ_CHECK(shared.empty(),
           "--device cuda over NCCL: "
               << shared
               << "; NCCL needs a GPU per rank: give each rank its own (e.g. mpirun ... bash -c "
                  "'CUDA_VISIBLE_DEVICES=$OMPI_COMM_WORLD_LOCAL_RANK exec BINARY ...', "
                  "docs/multi-node-gpu.md) or stage through host memory with --device-comm mpi");
  ncclUniqueId id;
  if (comm.rank() == 0) NCCL_CALL(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t nccl;
  NCCL_CALL(ncclCommInitRank(&nccl, comm.world_size(), id, comm.rank()));
  nccl_ = nccl;
  // Non-blocking: the communication stream neither waits for the legacy default stream nor makes
  // it wait; the order is the events' (CUDA programming guide, "Implicit synchronization";
  // cudaStreamWaitEvent), after the calling thread's stream (device.hpp).
  cudaStream_t stream;
  CUDA_CALL(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  stream_ = stream;
  cudaEvent_t event;
  CUDA_CALL(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  ready_ = event;
}

NcclTransport::~NcclTransport() {
  if (stream_) cudaStreamSynchronize(as_stream(stream_));
  if (nccl_) ncclCommDestroy(as_comm(nccl_));  // (null after an abort)
  if (stream_) cudaStreamDestroy(as_stream(stream_));
  if (ready_) cudaEventDestroy(static_cast<cudaEvent_t>(ready_));
}

void NcclTransport::synchronize(const char* op) {
  // As the communicator waits for MPI (comm_wait.cpp): spinning on the step's thread; testing
  // and sleeping on a communication thread, which gives up when its rank stops at an error. Then
  // NCCL's kernel is aborted, so that the error's unwinding (a stream synchronisation) does not
  // wait for a peer that will never join, and run_main's MPI_Abort is reached.
  try {
    Communicator::wait_until(
        [this] {
          const cudaError_t rc = cudaStreamQuery(as_stream(stream_));
          if (rc == cudaErrorNotReady) return false;
          CUDA_CALL(rc);
          return true;
        },
        [op] { return std::string("NCCL ") + op; });
  } catch (...) {
    if (nccl_) ncclCommAbort(as_comm(nccl_));
    nccl_ = nullptr;
    throw;
  }
}

template <class Queue>
void NcclTransport::run(const char* op, Queue queue) {
  const std::lock_guard lock(mutex_);
  auto ready = static_cast<cudaEvent_t>(ready_);
  CUDA_CALL(cudaEventRecord(ready, cudaStreamPerThread));  // the calling thread's stream
  CUDA_CALL(cudaStreamWaitEvent(as_stream(stream_), ready, 0));
  queue(as_comm(nccl_), as_stream(stream_));
  synchronize(op);
}

void NcclTransport::sendrecv(const void* send, int64_t send_bytes, int dest, void* recv,
                             int64_t recv_bytes, int src) {
  // One group: NCCL starts both sides together, so every rank of a ring sending to its right
  // and receiving from its left cannot deadlock (NCCL docs, "Point-to-point communication").
  run("sendrecv", [&](ncclComm_t comm, cudaStream_t stream) {
    NCCL_CALL(ncclGroupStart());
    if (send_bytes > 0)
      NCCL_CALL(ncclSend(send, static_cast<size_t>(send_bytes), ncclUint8, dest, comm, stream));
    if (recv_bytes > 0)
      NCCL_CALL(ncclRecv(recv, static_cast<size_t>(recv_bytes), ncclUint8, src, comm, stream));
    NCCL_CALL(ncclGroupEnd());
  });
}

void NcclTransport::broadcast(float* buf, int64_t n, int root) {
  run("broadcast", [&](ncclComm_t comm, cudaStream_t stream) {
    NCCL_CALL(ncclBroadcast(buf, buf, static_cast<size_t>(n), ncclFloat32, root, comm, stream));
  });
}

void NcclTransport::all_reduce(float* buf, int64_t n) {
  run("all_reduce", [&](ncclComm_t comm, cudaStream_t stream) {
    NCCL_CALL(ncclAllReduce(buf, buf, static_cast<size_t>(n), ncclFloat32, ncclSum, comm, stream));
  });
}

void NcclTransport::reduce_scatter(const float* in, float* out, int64_t n) {
  run("reduce_scatter", [&](ncclComm_t comm, cudaStream_t stream) {
    NCCL_CALL(
        ncclReduceScatter(in, out, static_cast<size_t>(n), ncclFloat32, ncclSum, comm, stream));
  });
}

void NcclTransport::all_gather(const float* in, float* out, int64_t n) {
  run("all_gather", [&](ncclComm_t comm, cudaStream_t stream) {
    NCCL_CALL(ncclAllGather(in, out, static_cast<size_t>(n), ncclFloat32, comm, stream));
  });
}

std::unique_ptr<DeviceTransport> make_nccl_transport(Communicator& comm) {
  return std::make_unique<NcclTransport>(comm);
}

}  // namespace ringzero
