#include "common/gpu/nccl_comm.hpp"

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <climits>

#include "common/check.hpp"

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

NcclCommunicator::NcclCommunicator(Communicator& comm) : DeviceComm(comm), comm_(comm) {
  std::string why;
  const int devices = gpu_device_count(&why);
  RZ_CHECK(devices > comm.local_rank(),
           "rank " << comm.rank() << " is local rank " << comm.local_rank() << " but " << devices
                   << " CUDA device(s) are visible (" << why << "); run at most one rank per GPU");
  device_ = comm.local_rank();
  CUDA_CALL(cudaSetDevice(device_));
  ncclUniqueId id;
  if (comm.rank() == 0) NCCL_CALL(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t nccl;
  NCCL_CALL(ncclCommInitRank(&nccl, comm.world_size(), id, comm.rank()));
  nccl_ = nccl;
  // A blocking stream (not cudaStreamNonBlocking): it waits for the kernels already queued on
  // the legacy default stream, where common/gpu/kernels.cu runs, so a gradient is complete
  // before NCCL reads it.
  cudaStream_t stream;
  CUDA_CALL(cudaStreamCreateWithFlags(&stream, cudaStreamDefault));
  stream_ = stream;
  // The overlap stream does NOT wait implicitly for the compute stream (nor it for this one):
  // the order is the event's (CUDA programming guide, "Implicit synchronization").
  cudaStream_t async_stream;
  CUDA_CALL(cudaStreamCreateWithFlags(&async_stream, cudaStreamNonBlocking));
  async_stream_ = async_stream;
  cudaEvent_t ready;
  CUDA_CALL(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  ready_ = ready;
}

NcclCommunicator::~NcclCommunicator() {
  if (nccl_) ncclCommDestroy(as_comm(nccl_));
  if (stream_) cudaStreamDestroy(as_stream(stream_));
  if (async_stream_) cudaStreamDestroy(as_stream(async_stream_));
  if (ready_) cudaEventDestroy(static_cast<cudaEvent_t>(ready_));
}

void NcclCommunicator::synchronize() {
  CUDA_CALL(cudaStreamSynchronize(as_stream(stream_)));
}

void NcclCommunicator::send(const float* buf, int64_t n, int dest) {
  comm_.count_external("send", true,
                       {0, static_cast<int64_t>(split_count(n).size()), n * 4, 0, 0});
  if (n > 0)
    NCCL_CALL(ncclSend(buf, static_cast<size_t>(n), ncclFloat32, dest, as_comm(nccl_),
                       as_stream(stream_)));
  synchronize();
}

void NcclCommunicator::recv(float* buf, int64_t n, int src) {
  comm_.count_external("recv", true,
                       {0, 0, 0, static_cast<int64_t>(split_count(n).size()), n * 4});
  if (n > 0)
    NCCL_CALL(ncclRecv(buf, static_cast<size_t>(n), ncclFloat32, src, as_comm(nccl_),
                       as_stream(stream_)));
  synchronize();
}

void NcclCommunicator::sendrecv(const float* send_buf, int64_t n_send, int dest, float* recv_buf,
                                int64_t n_recv, int src) {
  // Messages as Communicator counts them (one per INT_MAX piece, none for an empty side).
  comm_.count_external("sendrecv", true,
                       {0, static_cast<int64_t>(split_count(n_send).size()), n_send * 4,
                        static_cast<int64_t>(split_count(n_recv).size()), n_recv * 4});
  // One group: NCCL starts both sides together, so every rank of a ring sending to its right
  // and receiving from its left cannot deadlock (NCCL docs, "Point-to-point communication").
  NCCL_CALL(ncclGroupStart());
  if (n_send > 0)
    NCCL_CALL(ncclSend(send_buf, static_cast<size_t>(n_send), ncclFloat32, dest, as_comm(nccl_),
                       as_stream(stream_)));
  if (n_recv > 0)
    NCCL_CALL(ncclRecv(recv_buf, static_cast<size_t>(n_recv), ncclFloat32, src, as_comm(nccl_),
                       as_stream(stream_)));
  NCCL_CALL(ncclGroupEnd());
  synchronize();
}

void NcclCommunicator::all_reduce(float* buf, int64_t n) {
  comm_.count_external("all_reduce", false, {0, 0, n * 4, 0, n * 4});
  // NCCL counts are size_t: no INT_MAX split is needed, unlike MPI.
  NCCL_CALL(ncclAllReduce(buf, buf, static_cast<size_t>(n), ncclFloat32, ncclSum, as_comm(nccl_),
                          as_stream(stream_)));
  synchronize();
}

void NcclCommunicator::reduce_scatter(const float* in, float* out, int64_t n) {
  comm_.count_external("reduce_scatter", false,
                       {0, 0, n * (comm_.world_size() - 1) * 4, 0, n * 4});
  NCCL_CALL(ncclReduceScatter(in, out, static_cast<size_t>(n), ncclFloat32, ncclSum, as_comm(nccl_),
                              as_stream(stream_)));
  synchronize();
}

void NcclCommunicator::all_gather(const float* in, float* out, int64_t n) {
  comm_.count_external("all_gather", false,
                       {0, 0, n * 4, 0, n * (comm_.world_size() - 1) * 4});
  NCCL_CALL(ncclAllGather(in, out, static_cast<size_t>(n), ncclFloat32, as_comm(nccl_),
                          as_stream(stream_)));
  synchronize();
}

void NcclCommunicator::broadcast(float* buf, int64_t n, int root) {
  const bool root_rank = comm_.rank() == root;
  comm_.count_external("broadcast", false,
                       {0, 0, root_rank ? n * 4 : 0, 0, root_rank ? 0 : n * 4});
  NCCL_CALL(ncclBroadcast(buf, buf, static_cast<size_t>(n), ncclFloat32, root, as_comm(nccl_),
                          as_stream(stream_)));
  synchronize();
}

void NcclCommunicator::all_reduce_async(float* buf, int64_t n) {
  comm_.count_external("all_reduce", false, {0, 0, n * 4, 0, n * 4});
  auto ready = static_cast<cudaEvent_t>(ready_);
  CUDA_CALL(cudaEventRecord(ready, cudaStreamLegacy));  // after the gradients' kernels
  CUDA_CALL(cudaStreamWaitEvent(as_stream(async_stream_), ready, 0));
  NCCL_CALL(ncclAllReduce(buf, buf, static_cast<size_t>(n), ncclFloat32, ncclSum, as_comm(nccl_),
                          as_stream(async_stream_)));
}

void NcclCommunicator::wait_async() {
  CUDA_CALL(cudaStreamSynchronize(as_stream(async_stream_)));
}

}  // namespace ringzero
