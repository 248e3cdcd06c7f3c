// gpu_nccl_check: the GPU path's test and benchmark, run under mpirun, one rank per GPU.
//
//   mpirun -np 1 build/tests/gpu_nccl_check            (or -np <number of GPUs>)
//
// Checks NcclCommunicator's all_reduce, reduce_scatter and all_gather against exact sums of
// integer-valued floats (exact in float32 below 2^24, so any order of summation gives the same
// bits), then prints a bus-bandwidth table (nccl-tests definitions: algbw = S / t,
// busbw = algbw · 2(N−1)/N). Exits 77 — ctest's "skipped" — on every rank when some rank has
// no GPU of its own, so CPU-only machines skip it cleanly instead of failing or hanging.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <vector>

#include "common/core/check.hpp"
#include "common/device/gpu/nccl_comm.hpp"

using namespace ringzero;

static double expected_sum(int world_size, int64_t i) {  // Σ_r (r + 1) · (i mod 7)
  return world_size * (world_size + 1) / 2.0 * static_cast<double>(i % 7);
}

int main(int argc, char** argv) {
  Communicator comm(argc, argv);
  std::string why;
  const bool have_gpu = gpu_device_count(&why) > comm.local_rank();
  double ok[1] = {have_gpu ? 1.0 : 0.0};
  comm.all_reduce_metrics(ok);  // every rank takes the same decision: no rank is left in NCCL init
  if (ok[0] < comm.world_size()) {
    if (comm.rank() == 0)
      std::printf("SKIP: %d of %d ranks have a CUDA device of their own (%s)\n",
                  static_cast<int>(ok[0]), comm.world_size(),
                  have_gpu ? "devices shared" : why.c_str());
    return 77;
  }
  return run_main([&] {
    NcclCommunicator nccl(comm);
    const int N = comm.world_size(), r = comm.rank();
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{(1 << 20) + 3}}) {
      std::vector<float> host(static_cast<size_t>(n * N));
      for (int64_t i = 0; i < n * N; ++i) host[i] = static_cast<float>((r + 1) * (i % 7));
      float *in = nullptr, *out = nullptr;
      RZ_CHECK(cudaMalloc(&in, host.size() * 4) == cudaSuccess &&
                   cudaMalloc(&out, host.size() * 4) == cudaSuccess,
               "cudaMalloc of " << host.size() * 8 << " bytes failed");
      cudaMemcpy(in, host.data(), host.size() * 4, cudaMemcpyHostToDevice);
      std::vector<float> back(host.size());
      nccl.all_reduce(in, n * N);
      cudaMemcpy(back.data(), in, back.size() * 4, cudaMemcpyDeviceToHost);
      for (int64_t i = 0; i < n * N; ++i)
        RZ_CHECK(back[i] == expected_sum(N, i),
                 "all_reduce n=" << n * N << " element " << i << ": " << back[i]);
      cudaMemcpy(in, host.data(), host.size() * 4, cudaMemcpyHostToDevice);
      nccl.reduce_scatter(in, out, n);
      cudaMemcpy(back.data(), out, static_cast<size_t>(n) * 4, cudaMemcpyDeviceToHost);
      for (int64_t i = 0; i < n; ++i)
        RZ_CHECK(back[i] == expected_sum(N, r * n + i),
                 "reduce_scatter n=" << n << " element " << i << ": " << back[i]);
      nccl.all_gather(out, in, n);
      cudaMemcpy(back.data(), in, back.size() * 4, cudaMemcpyDeviceToHost);
      for (int64_t i = 0; i < n * N; ++i)
        RZ_CHECK(back[i] == expected_sum(N, i),
                 "all_gather n=" << n << " element " << i << ": " << back[i]);
      cudaFree(in);
      cudaFree(out);
    }
    print0("PASS: NCCL all_reduce, reduce_scatter, all_gather exact on " + std::to_string(N) +
           " rank(s), device " + std::to_string(nccl.device()));
    print0("bytes        algbw GB/s   busbw GB/s");
    for (int64_t bytes = 4096; bytes <= (int64_t{64} << 20); bytes *= 4) {
      float* buf = nullptr;
      cudaMalloc(&buf, static_cast<size_t>(bytes));
      cudaMemset(buf, 0, static_cast<size_t>(bytes));
      for (int w = 0; w < 3; ++w) nccl.all_reduce(buf, bytes / 4);
      const int iters = 20;
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) nccl.all_reduce(buf, bytes / 4);
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
      const double algbw = static_cast<double>(bytes) / s / 1e9;
      char line[96];
      std::snprintf(line, sizeof line, "%-12lld %-12.2f %-12.2f", static_cast<long long>(bytes),
                    algbw, algbw * 2.0 * (N - 1) / N);
      print0(line);
      cudaFree(buf);
    }
    return 0;
  });
}
