// gpu_comm_check: the NCCL transport (DeviceComm) on device buffers, under mpirun.
//
//   mpirun -np 1 build-cuda/tests/gpu_comm_check      (one rank per GPU)
//
// 1. Chapter 04's ring all-reduce, ring.hpp's own templates (reduce-scatter then all-gather,
//    N-1 sendrecv hops each) over DeviceComm with DeviceAdd (a CUDA kernel) as the hop's add, on
//    integer-valued floats (exact in float32 below 2^24, so every summation order gives the same
//    bits): the result must equal the exact sum, and the counters must show the bytes the CPU
//    ring sends (ring.hpp's ring_reduce_scatter_sent + ring_all_gather_sent).
// 2. all_reduce, reduce_scatter, all_gather: exact sums again.
// 3. The async calls in place, as a communication stream under chapters 05-08 would use them
//    (reduce-scatter into chunk r of its input, all-gather from chunk r, all-reduce), each
//    waited for on the compute stream.
// 4. all_reduce bus bandwidth (nccl-tests definitions: busbw = S / t · 2(N-1)/N).
// Exits 77 on every rank when a rank has no GPU of its own (NCCL needs one per rank).
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "chapters/04_ring_allreduce/ring.hpp"
#include "common/core/check.hpp"
#include "common/device/gpu/device.hpp"
#include "common/device/gpu/nccl_comm.hpp"

using namespace ringzero;

namespace {

float value(int rank, int64_t i) {
  return static_cast<float>((rank + 1) * (i % 7));
}
float expected(int world_size, int64_t i) {
  return static_cast<float>(world_size * (world_size + 1) / 2 * (i % 7));
}

}  // namespace

int main(int argc, char** argv) {
  Communicator comm(argc, argv);
  const std::string transport = "nccl";
  std::string why;
  const int devices = gpu_device_count(&why);
  const bool have = devices > comm.local_rank();
  double ok[1] = {have ? 1.0 : 0.0};
  comm.all_reduce_metrics(ok);
  if (ok[0] < comm.world_size()) {
    if (comm.rank() == 0)
      std::printf("SKIP: %s transport: %d of %d ranks have a GPU to use (%d visible%s%s)\n",
                  transport.c_str(), static_cast<int>(ok[0]), comm.world_size(), devices,
                  why.empty() ? "" : "; ", why.c_str());
    return 77;
  }
  return run_main([&] {
    std::unique_ptr<DeviceComm> dc = std::make_unique<NcclCommunicator>(comm);
    const int N = comm.world_size(), r = comm.rank();
    comm.reset_counters();
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{(1 << 20) + 3}}) {
      std::vector<float> host(static_cast<size_t>(n * N)), back(host.size());
      for (int64_t i = 0; i < n * N; ++i) host[i] = value(r, i);
      DeviceBuffer in(n * N, MemTag::comm_buffers), out(n * N, MemTag::comm_buffers),
          tmp(n * N, MemTag::comm_buffers);
      // 1. the ring, with the counters of exactly this call
      in.copy_from_host(host.data(), n * N);
      const auto before = dc->counters();
      // chapter 04's ring itself (ring.hpp's templates), its hop add a CUDA kernel
      const std::span<float> buf(in.data(), static_cast<size_t>(n * N));
      ring_reduce_scatter(*dc, buf, tmp.span(), DeviceAdd{});
      ring_all_gather(*dc, buf);
      const auto after = dc->counters();
      auto sent = [](const std::map<std::string, Communicator::Counters>& m) {
        int64_t s = 0;
        for (auto& [op, c] : m) s += op == "metrics" ? 0 : c.bytes_sent;
        return s;
      };
      const int64_t got = sent(after) - sent(before);
      // what the CPU ring sends: every chunk but one per phase (ring.hpp's traffic formulas)
      const int64_t want = 4 * (ring_reduce_scatter_sent(n * N, N, r) +
                                ring_all_gather_sent(n * N, N, r));
      RZ_CHECK(got == want, "ring bytes sent " << got << " != " << want);
      in.copy_to_host(back.data(), n * N);
      for (int64_t i = 0; i < n * N; ++i)
        RZ_CHECK(back[i] == expected(N, i),
                 "ring all-reduce n=" << n * N << " element " << i << ": " << back[i]);
      // 2. the collectives
      in.copy_from_host(host.data(), n * N);
      dc->all_reduce(in.data(), n * N);
      in.copy_to_host(back.data(), n * N);
      for (int64_t i = 0; i < n * N; ++i)
        RZ_CHECK(back[i] == expected(N, i), "all_reduce element " << i << ": " << back[i]);
      in.copy_from_host(host.data(), n * N);
      dc->reduce_scatter(in.data(), out.data(), n);
      out.copy_to_host(back.data(), n);
      for (int64_t i = 0; i < n; ++i)
        RZ_CHECK(back[i] == expected(N, r * n + i), "reduce_scatter element " << i);
      dc->all_gather(out.data(), in.data(), n);
      in.copy_to_host(back.data(), n * N);
      for (int64_t i = 0; i < n * N; ++i)
        RZ_CHECK(back[i] == expected(N, i), "all_gather element " << i << ": " << back[i]);
      // 3. the async calls in place, as the chapters use them: reduce-scatter into chunk r of
      // its own input, all-gather from chunk r, all-reduce; waited for on the compute stream
      in.copy_from_host(host.data(), n * N);
      dc->wait(dc->reduce_scatter_async(in.data(), in.data() + r * n, n));
      dc->wait(dc->all_gather_async(in.data() + r * n, in.data(), n));
      const int64_t t = dc->all_reduce_async(in.data(), n * N);  // Σ over ranks of the sums
      dc->wait(t);
      in.copy_to_host(back.data(), n * N);
      for (int64_t i = 0; i < n * N; ++i)
        RZ_CHECK(back[i] == N * expected(N, i),
                 "async in-place reduce_scatter + all_gather + all_reduce element " << i << ": "
                                                                                    << back[i]);
    }
    print0("PASS: " + dc->transport() + " on " + std::to_string(N) +
           " rank(s): ring all-reduce over sendrecv, all_reduce, reduce_scatter, all_gather "
           "exact; ring bytes sent = 2(N-1) chunks as on the CPU");
    print0("all_reduce " + dc->transport() + ", N = " + std::to_string(N));
    print0("bytes        time us      algbw GB/s   busbw GB/s");
    for (int64_t bytes = 4096; bytes <= (int64_t{64} << 20); bytes *= 8) {
      DeviceBuffer buf(bytes / 4, MemTag::comm_buffers);
      for (int w = 0; w < 3; ++w) dc->all_reduce(buf.data(), bytes / 4);
      const int iters = 20;
      comm.barrier();
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) dc->all_reduce(buf.data(), bytes / 4);
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
      const double algbw = static_cast<double>(bytes) / s / 1e9;
      char line[128];
      std::snprintf(line, sizeof line, "%-12lld %-12.1f %-12.2f %-12.2f",
                    static_cast<long long>(bytes), s * 1e6, algbw, algbw * 2.0 * (N - 1) / N);
      print0(line);
    }
    return 0;
  });
}
