#include "common/device/gpu/nccl_comm.hpp"

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <climits>

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
  // Non-blocking: the communication stream neither waits for the legacy default stream (where
  // common/device/gpu/kernels.cu runs) nor makes it wait; the order is the events' (CUDA
  // programming guide, "Implicit synchronization"; cudaStreamWaitEvent).
  cudaStream_t stream;
  CUDA_CALL(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  stream_ = stream;
  cudaEvent_t event;
  CUDA_CALL(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  ready_ = event;
  for (void*& done : done_) {
    CUDA_CALL(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    done = event;
  }
}

NcclCommunicator::~NcclCommunicator() {
  if (stream_) cudaStreamSynchronize(as_stream(stream_));
  if (nccl_) ncclCommDestroy(as_comm(nccl_));
  if (stream_) cudaStreamDestroy(as_stream(stream_));
  if (ready_) cudaEventDestroy(static_cast<cudaEvent_t>(ready_));
  for (void* done : done_)
    if (done) cudaEventDestroy(static_cast<cudaEvent_t>(done));
}

void NcclCommunicator::after_compute() {
  auto ready = static_cast<cudaEvent_t>(ready_);
  CUDA_CALL(cudaEventRecord(ready, cudaStreamLegacy));
  CUDA_CALL(cudaStreamWaitEvent(as_stream(stream_), ready, 0));
}

int64_t NcclCommunicator::issued() {
  const int64_t ticket = issue_ticket();
  // A ticket's event is reused kTickets tickets later: if the ticket it held was never waited
  // for, the host waits for it here (then no wait for it, or any before it, is needed).
  auto& slot = done_[ticket % kTickets];
  if (ticket - waited_ >= kTickets) {
    CUDA_CALL(cudaEventSynchronize(static_cast<cudaEvent_t>(slot)));
    waited_ = ticket - kTickets + 1;
  }
  CUDA_CALL(cudaEventRecord(static_cast<cudaEvent_t>(slot), as_stream(stream_)));
  return ticket;
}

void NcclCommunicator::wait(int64_t ticket) {
  check_ticket(ticket);
  if (ticket < waited_) return;  // ticket 0 (a blocking call) or one already waited for
  CUDA_CALL(cudaStreamWaitEvent(cudaStreamLegacy,
                                static_cast<cudaEvent_t>(done_[ticket % kTickets]), 0));
  waited_ = ticket + 1;  // one stream: every ticket before it completes first
}

void NcclCommunicator::wait_async() {
  if (tickets() >= waited_) wait(tickets());
}

void NcclCommunicator::synchronize() {
  CUDA_CALL(cudaStreamSynchronize(as_stream(stream_)));
  waited_ = tickets() + 1;  // everything queued is done
}

void NcclCommunicator::send(const float* buf, int64_t n, int dest) {
  after_compute();
  const int mark = begin_span(stream_);
  comm_.count_external("send", true,
                       {0, static_cast<int64_t>(split_count(n).size()), n * 4, 0, 0});
  if (n > 0)
    NCCL_CALL(ncclSend(buf, static_cast<size_t>(n), ncclFloat32, dest, as_comm(nccl_),
                       as_stream(stream_)));
  end_span("send", mark, stream_);
  synchronize();
}

void NcclCommunicator::recv(float* buf, int64_t n, int src) {
  after_compute();
  const int mark = begin_span(stream_);
  comm_.count_external("recv", true,
                       {0, 0, 0, static_cast<int64_t>(split_count(n).size()), n * 4});
  if (n > 0)
    NCCL_CALL(ncclRecv(buf, static_cast<size_t>(n), ncclFloat32, src, as_comm(nccl_),
                       as_stream(stream_)));
  end_span("recv", mark, stream_);
  synchronize();
}

void NcclCommunicator::sendrecv(const float* send_buf, int64_t n_send, int dest, float* recv_buf,
                                int64_t n_recv, int src) {
  after_compute();
  const int mark = begin_span(stream_);
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
  end_span("sendrecv", mark, stream_);
  synchronize();
}

void NcclCommunicator::all_reduce(float* buf, int64_t n) {
  all_reduce_async(buf, n);
  synchronize();
}

void NcclCommunicator::reduce_scatter(const float* in, float* out, int64_t n) {
  reduce_scatter_async(in, out, n);
  synchronize();
}

void NcclCommunicator::all_gather(const float* in, float* out, int64_t n) {
  all_gather_async(in, out, n);
  synchronize();
}

void NcclCommunicator::broadcast(float* buf, int64_t n, int root) {
  after_compute();
  const int mark = begin_span(stream_);
  const bool root_rank = comm_.rank() == root;
  comm_.count_external("broadcast", false,
                       {0, 0, root_rank ? n * 4 : 0, 0, root_rank ? 0 : n * 4});
  NCCL_CALL(ncclBroadcast(buf, buf, static_cast<size_t>(n), ncclFloat32, root, as_comm(nccl_),
                          as_stream(stream_)));
  end_span("broadcast", mark, stream_);
  synchronize();
}

// The blocking collectives above are these and a wait for the stream. NCCL counts are size_t:
// no INT_MAX split is needed, unlike MPI.
int64_t NcclCommunicator::all_reduce_async(float* buf, int64_t n) {
  after_compute();
  const int mark = begin_span(stream_);
  comm_.count_external("all_reduce", false, {0, 0, n * 4, 0, n * 4});
  NCCL_CALL(ncclAllReduce(buf, buf, static_cast<size_t>(n), ncclFloat32, ncclSum, as_comm(nccl_),
                          as_stream(stream_)));
  end_span("all_reduce", mark, stream_);
  return issued();
}

int64_t NcclCommunicator::reduce_scatter_async(const float* in, float* out, int64_t n) {
  after_compute();
  const int mark = begin_span(stream_);
  comm_.count_external("reduce_scatter", false,
                       {0, 0, n * (comm_.world_size() - 1) * 4, 0, n * 4});
  NCCL_CALL(ncclReduceScatter(in, out, static_cast<size_t>(n), ncclFloat32, ncclSum, as_comm(nccl_),
                              as_stream(stream_)));
  end_span("reduce_scatter", mark, stream_);
  return issued();
}

int64_t NcclCommunicator::all_gather_async(const float* in, float* out, int64_t n) {
  after_compute();
  const int mark = begin_span(stream_);
  comm_.count_external("all_gather", false,
                       {0, 0, n * 4, 0, n * (comm_.world_size() - 1) * 4});
  NCCL_CALL(ncclAllGather(in, out, static_cast<size_t>(n), ncclFloat32, as_comm(nccl_),
                          as_stream(stream_)));
  end_span("all_gather", mark, stream_);
  return issued();
}

}  // namespace ringzero
