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

NcclCommunicator::NcclCommunicator(Communicator& comm) : comm_(comm) {
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
}

NcclCommunicator::~NcclCommunicator() {
  if (nccl_) ncclCommDestroy(as_comm(nccl_));
  if (stream_) cudaStreamDestroy(as_stream(stream_));
}

void NcclCommunicator::synchronize() {
  CUDA_CALL(cudaStreamSynchronize(as_stream(stream_)));
}

void NcclCommunicator::sendrecv(const float* send_buf, int64_t n_send, int dest, float* recv_buf,
                                int64_t n_recv, int src) {
  auto& c = counters_["sendrecv"];
  c.calls += 1;
  // Messages as Communicator counts them (one per INT_MAX piece, none for an empty side).
  c.messages_sent += static_cast<int64_t>(split_count(n_send).size());
  c.bytes_sent += n_send * 4;
  c.messages_received += static_cast<int64_t>(split_count(n_recv).size());
  c.bytes_received += n_recv * 4;
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
  auto& c = counters_["all_reduce"];
  c.calls += 1;
  c.bytes_sent += n * 4;
  c.bytes_received += n * 4;
  // NCCL counts are size_t: no INT_MAX split is needed, unlike MPI.
  NCCL_CALL(ncclAllReduce(buf, buf, static_cast<size_t>(n), ncclFloat32, ncclSum, as_comm(nccl_),
                          as_stream(stream_)));
  synchronize();
}

void NcclCommunicator::reduce_scatter(const float* in, float* out, int64_t n) {
  auto& c = counters_["reduce_scatter"];
  c.calls += 1;
  c.bytes_sent += n * (comm_.world_size() - 1) * 4;
  c.bytes_received += n * 4;
  NCCL_CALL(ncclReduceScatter(in, out, static_cast<size_t>(n), ncclFloat32, ncclSum, as_comm(nccl_),
                              as_stream(stream_)));
  synchronize();
}

void NcclCommunicator::all_gather(const float* in, float* out, int64_t n) {
  auto& c = counters_["all_gather"];
  c.calls += 1;
  c.bytes_sent += n * 4;
  c.bytes_received += n * (comm_.world_size() - 1) * 4;
  NCCL_CALL(ncclAllGather(in, out, static_cast<size_t>(n), ncclFloat32, as_comm(nccl_),
                          as_stream(stream_)));
  synchronize();
}

void NcclCommunicator::broadcast(float* buf, int64_t n, int root) {
  auto& c = counters_["broadcast"];
  c.calls += 1;
  (comm_.rank() == root ? c.bytes_sent : c.bytes_received) += n * 4;
  NCCL_CALL(ncclBroadcast(buf, buf, static_cast<size_t>(n), ncclFloat32, root, as_comm(nccl_),
                          as_stream(stream_)));
  synchronize();
}

}  // namespace ringzero
