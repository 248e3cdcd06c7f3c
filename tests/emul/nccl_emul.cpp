// NCCL and the CUDA runtime's stream and event calls, emulated on the CPU over MPI for tests/emul:
// with it, common/device/gpu/nccl_transport.cpp itself (the group around each sendrecv, the
// datatypes, the byte counts, the order of its calls) runs under every chapter with --device
// cuda on machines without a GPU. Device memory there is host memory (device_emul.cpp), so each
// NCCL call is the MPI call of the same meaning on a duplicate of MPI_COMM_WORLD (its own
// messages never meet the Communicator's): ncclSend/ncclRecv inside a group are posted at
// ncclGroupEnd and completed together, as NCCL starts a group's operations together; streams
// and events are names only, since every emulated call is complete when it returns.
// What it cannot test: NCCL and CUDA themselves (scripts/gpu-check does).
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <utility>
#include <vector>

#include "common/core/check.hpp"

struct ncclComm {
  MPI_Comm mpi = MPI_COMM_NULL;
  int rank = 0, size = 1;
};

namespace {

// A stream or an event: a distinct non-null name.
template <class Handle>
Handle make_handle() {
  return reinterpret_cast<Handle>(new char);
}
template <class Handle>
void free_handle(Handle h) {
  delete reinterpret_cast<char*>(h);
}

MPI_Datatype mpi_type(ncclDataType_t type) {
  RZ_CHECK(type == ncclUint8 || type == ncclFloat32, "NCCL emulation: datatype "
                                                         << static_cast<int>(type)
                                                         << " (only ncclUint8, ncclFloat32)");
  return type == ncclUint8 ? MPI_BYTE : MPI_FLOAT;
}
int mpi_count(size_t count) {
  RZ_CHECK(count <= INT_MAX, "NCCL emulation: " << count << " elements in one call");
  return static_cast<int>(count);
}

// One point-to-point operation of an open group.
struct P2P {
  bool send;
  void* buf;
  size_t count;
  ncclDataType_t type;
  int peer;
  ncclComm_t comm;
};
thread_local int group_depth = 0;
thread_local std::vector<P2P> group;

// Posts every operation (receives first), then tests and sleeps until all are done: the
// emulated GPU's communication thread shares the cores with computation, as CommThread does.
void run_p2p(const std::vector<P2P>& ops) {
  std::vector<MPI_Request> requests(ops.size());
  for (size_t pass = 0; pass < 2; ++pass)
    for (size_t i = 0; i < ops.size(); ++i) {
      const P2P& op = ops[i];
      if (op.send != (pass == 1)) continue;
      const int rc = op.send ? MPI_Isend(op.buf, mpi_count(op.count), mpi_type(op.type), op.peer, 0,
                                         op.comm->mpi, &requests[i])
                             : MPI_Irecv(op.buf, mpi_count(op.count), mpi_type(op.type), op.peer, 0,
                                         op.comm->mpi, &requests[i]);
      RZ_CHECK(rc == MPI_SUCCESS, "NCCL emulation: MPI point-to-point failed");
    }
  for (;;) {
    int done = 0;
    MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE);
    if (done) return;
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

ncclResult_t p2p(P2P op) {
  if (group_depth > 0)
    group.push_back(op);
  else
    run_p2p({op});
  return ncclSuccess;
}

ncclResult_t ok(int mpi_rc) {
  return mpi_rc == MPI_SUCCESS ? ncclSuccess : ncclSystemError;
}

}  // namespace

extern "C" {

const char* cudaGetErrorString(cudaError_t) {
  return "CUDA emulated on the CPU (tests/emul)";
}
cudaError_t cudaGetDeviceCount(int* count) {
  *count = 64;  // one per local rank, always
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int) {
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
// One emulated GPU per process; RINGZERO_EMUL_GPUS=G: G per node, local rank r on GPU r mod G
// (so a test can put two ranks on one GPU).
cudaError_t cudaDeviceGetPCIBusId(char* bus, int len, int) {
  const char* gpus = std::getenv("RINGZERO_EMUL_GPUS");
  const char* local_rank = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  if (gpus != nullptr && local_rank != nullptr)
    std::snprintf(bus, static_cast<size_t>(len), "emulated-%d",
                  std::atoi(local_rank) % std::max(1, std::atoi(gpus)));
  else
    std::snprintf(bus, static_cast<size_t>(len), "emulated-pid-%d", static_cast<int>(getpid()));
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  *stream = make_handle<cudaStream_t>();
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  free_handle(stream);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) {
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t) {  // every emulated call is done when it returns
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned int) {
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  *event = make_handle<cudaEvent_t>();
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) {
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  free_handle(event);
  return cudaSuccess;
}

const char* ncclGetErrorString(ncclResult_t) {
  return "NCCL emulated over MPI (tests/emul)";
}
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  *id = ncclUniqueId{};
  return ncclSuccess;
}
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId, int rank) {
  *comm = new ncclComm{MPI_COMM_NULL, rank, nranks};
  return ok(MPI_Comm_dup(MPI_COMM_WORLD, &(*comm)->mpi));
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&comm->mpi);
  delete comm;
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  return ncclCommDestroy(comm);
}
ncclResult_t ncclGroupStart() {
  ++group_depth;
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd() {
  if (--group_depth == 0) run_p2p(std::exchange(group, {}));
  return ncclSuccess;
}
ncclResult_t ncclSend(const void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t) {
  return p2p({true, const_cast<void*>(buf), count, type, peer, comm});
}
ncclResult_t ncclRecv(void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t) {
  return p2p({false, buf, count, type, peer, comm});
}
ncclResult_t ncclBroadcast(const void* in, void* out, size_t count, ncclDataType_t type, int root,
                           ncclComm_t comm, cudaStream_t) {
  RZ_CHECK(in == out, "NCCL emulation: broadcast in place only");
  return ok(MPI_Bcast(out, mpi_count(count), mpi_type(type), root, comm->mpi));
}
ncclResult_t ncclAllReduce(const void* in, void* out, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t) {
  RZ_CHECK(op == ncclSum && type == ncclFloat32, "NCCL emulation: float32 sums only");
  return ok(MPI_Allreduce(in == out ? MPI_IN_PLACE : in, out, mpi_count(count), MPI_FLOAT, MPI_SUM,
                          comm->mpi));
}
ncclResult_t ncclReduceScatter(const void* in, void* out, size_t count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t) {
  RZ_CHECK(op == ncclSum && type == ncclFloat32, "NCCL emulation: float32 sums only");
  // NCCL's in place is out == in + rank·count; MPI's IN_PLACE means another layout: go through a
  // copy when the two overlap.
  const auto* first = static_cast<const float*>(in);
  auto* result = static_cast<float*>(out);
  const bool overlap = result < first + comm->size * count && first < result + count;
  std::vector<float> copy(overlap ? count : 0);
  const int rc = MPI_Reduce_scatter_block(in, overlap ? copy.data() : out, mpi_count(count),
                                          MPI_FLOAT, MPI_SUM, comm->mpi);
  if (overlap) std::copy(copy.begin(), copy.end(), result);
  return ok(rc);
}
ncclResult_t ncclAllGather(const void* in, void* out, size_t count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t) {
  const size_t bytes = count * (type == ncclUint8 ? 1 : 4);
  const bool in_place = in == static_cast<char*>(out) + comm->rank * bytes;
  return ok(MPI_Allgather(in_place ? MPI_IN_PLACE : in, mpi_count(count), mpi_type(type), out,
                          mpi_count(count), mpi_type(type), comm->mpi));
}

}  // extern "C"
