// gpu_comm_check: the Communicator on device buffers over NCCL (NcclTransport under it), under
// mpirun, one rank per GPU; built twice: against CUDA and NCCL (build/tests/gpu_comm_check,
// scripts/gpu-check), and against their CPU emulation (build/emul/emul_comm_check, ctest at
// N = 1-4 on any machine).
//
//   mpirun -np 1 build/tests/gpu_comm_check
//   mpirun -np 2 bash -c 'CUDA_VISIBLE_DEVICES=$OMPI_COMM_WORLD_LOCAL_RANK exec "$0"'
//       build/tests/gpu_comm_check                (one command, on one line: a GPU per rank)
//
// 1. Chapter 04's ring all-reduce, ring.hpp's own templates (reduce-scatter then all-gather,
//    N-1 sendrecv hops each, the hop's add the backend's) over the Communicator on device
//    buffers, on integer-valued floats (exact in float32 below 2^24, so every summation order
//    gives the same bits), and on bf16 bits (the ring's 16-bit sendrecv): the result must equal
//    the exact sum, and the counters must show the bytes the CPU ring sends (ring.hpp's
//    ring_reduce_scatter_sent + ring_all_gather_sent).
// 2. all_reduce, reduce_scatter, all_gather (also in place, as the ZeRO engines call them),
//    broadcast: exact sums again.
// 3. all_reduce bus bandwidth (nccl-tests definitions: busbw = S / t · 2(N-1)/N).
// Exits 77 on every rank when a rank sees no GPU; two ranks on one GPU stop with NCCL's
// transport's message (give each rank its own: scripts/gpu-check's per_gpu launch).
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "chapters/04_ring_allreduce/ring.hpp"
#include "common/core/check.hpp"
#include "common/core/device_backend.hpp"
#include "common/core/device_memory.hpp"
#include "common/core/half.hpp"
#include "common/device/gpu/nccl_transport.hpp"

using namespace ringzero;

namespace {

float value(int rank, int64_t i) {
  return static_cast<float>((rank + 1) * (i % 7));
}
float expected(int world_size, int64_t i) {
  return static_cast<float>(world_size * (world_size + 1) / 2 * (i % 7));
}

// n elements of T on the GPU, filled from `host`.
template <class T>
BufferOf<T> on_gpu(const std::vector<T>& host) {
  BufferOf<T> buf(std::ssize(host), MemTag::comm_buffers, Device::cuda);
  copy_elements(std::span<const T>(host), buf.span());
  return buf;
}
template <class Buffer>
auto on_host(const Buffer& buf) {
  const auto values = buf.span();
  std::vector<std::remove_const_t<typename decltype(values)::element_type>> host(values.size());
  copy_elements(values, std::span(host));
  return host;
}

int64_t bytes_sent(const Communicator& comm) {
  return comm.training_traffic().bytes_sent;
}

// 1 and 2 for one size: n elements per rank's block.
void check_size(Communicator& comm, int64_t n) {
  const int N = comm.world_size(), r = comm.rank();
  std::vector<float> host(static_cast<size_t>(n * N));
  for (int64_t i = 0; i < n * N; ++i) host[i] = value(r, i);
  auto exact = [&](const std::vector<float>& got, int64_t first, const char* what) {
    for (size_t i = 0; i < got.size(); ++i)
      RZ_CHECK(got[i] == expected(N, first + static_cast<int64_t>(i)),
               what << " n=" << n << " element " << i << ": " << got[i]);
  };
  // 1. the ring, with the counters of exactly this call
  BufferOf<float> buf = on_gpu(host), scratch(n * N, MemTag::comm_buffers, Device::cuda);
  const int64_t before = bytes_sent(comm);
  ring_reduce_scatter(comm, buf.span(), scratch.span());
  ring_all_gather(comm, buf.span());
  const int64_t want =
      4 * (ring_reduce_scatter_sent(n * N, N, r) + ring_all_gather_sent(n * N, N, r));
  RZ_CHECK(bytes_sent(comm) - before == want,
           "ring bytes sent " << bytes_sent(comm) - before << " != " << want);
  exact(on_host(buf), 0, "ring all-reduce");
  std::vector<uint16_t> half(host.size());
  convert_to_half(Dtype::bf16, std::span<const float>(host),
                  std::span<uint16_t>(half));  // integers below 256: exact in bf16
  BufferOf<uint16_t> buf16 = on_gpu(half), scratch16(n * N, MemTag::comm_buffers, Device::cuda);
  ring_all_reduce(comm, as_elements<bf16>(buf16.span()), as_elements<bf16>(scratch16.span()));
  std::vector<float> back(host.size());
  const std::vector<uint16_t> sum16 = on_host(buf16);
  convert_to_float(Dtype::bf16, std::span<const uint16_t>(sum16), std::span<float>(back));
  exact(back, 0, "bf16 ring all-reduce");
  // 2. the collectives
  buf = on_gpu(host);
  comm.all_reduce(buf.span());
  exact(on_host(buf), 0, "all_reduce");
  buf = on_gpu(host);
  BufferOf<float> out(n, MemTag::comm_buffers, Device::cuda);
  comm.reduce_scatter(buf.span(), out.span());
  exact(on_host(out), r * n, "reduce_scatter");
  comm.all_gather(out.span(), buf.span());
  exact(on_host(buf), 0, "all_gather");
  buf = on_gpu(host);  // in place, as ZeRO: into chunk r of the input, gathered from there
  const std::span<float> mine =
      buf.span().subspan(static_cast<size_t>(r * n), static_cast<size_t>(n));
  comm.reduce_scatter(buf.span(), mine);
  comm.all_gather(mine, buf.span());
  exact(on_host(buf), 0, "in-place reduce_scatter + all_gather");
  buf = on_gpu(host);
  comm.all_reduce(buf.span());
  comm.broadcast(buf.span(), N - 1);
  exact(on_host(buf), 0, "broadcast");
}

}  // namespace

int main(int argc, char** argv) {
  Communicator comm(argc, argv);
  std::string why;
  const int devices = gpu_device_count(&why);
  double ok[1] = {devices > 0 ? 1.0 : 0.0};
  comm.all_reduce_metrics(ok);  // every rank takes the same decision: none is left in NCCL init
  if (ok[0] < comm.world_size()) {
    if (comm.rank() == 0)
      std::printf("SKIP: %d of %d ranks have a GPU to use (%d visible%s%s)\n",
                  static_cast<int>(ok[0]), comm.world_size(), devices, why.empty() ? "" : "; ",
                  why.c_str());
    return 77;
  }
  return run_main([&] {
    backend(Device::cuda);  // the CUDA backend (register_cuda.cpp), its name checked here
    NcclTransport nccl(comm);
    comm.set_device_transport(&nccl);
    const int N = comm.world_size();
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{(1 << 18) + 3}})
      check_size(comm, n);
    print0("PASS: the Communicator over " + nccl.name() + " on " + std::to_string(N) +
           " rank(s): ring all-reduce over sendrecv (float32 and bf16), all_reduce, "
           "reduce_scatter, all_gather (also in place), broadcast exact; ring bytes sent = "
           "2(N-1) chunks as on the CPU");
    print0("all_reduce " + nccl.name() + ", N = " + std::to_string(N));
    print0("bytes        time us      algbw GB/s   busbw GB/s");
    for (int64_t bytes = 4096; bytes <= (int64_t{64} << 20); bytes *= 8) {
      BufferOf<float> buf(bytes / 4, MemTag::comm_buffers, Device::cuda);
      for (int w = 0; w < 3; ++w) comm.all_reduce(buf.span());
      const int iters = 20;
      comm.barrier();
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) comm.all_reduce(buf.span());
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
      const double algbw = static_cast<double>(bytes) / s / 1e9;
      char line[128];
      std::snprintf(line, sizeof line, "%-12lld %-12.1f %-12.2f %-12.2f",
                    static_cast<long long>(bytes), s * 1e6, algbw, algbw * 2.0 * (N - 1) / N);
      print0(line);
    }
    comm.set_device_transport(nullptr);
    return 0;
  });
}
