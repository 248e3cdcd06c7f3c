// gpu_comm_check: DeviceComm on device buffers, either transport, under mpirun.
//
//   mpirun -np 1 build-cuda/tests/gpu_comm_check --transport nccl     (one rank per GPU)
//   mpirun -np 2 build-cuda/tests/gpu_comm_check --transport staged   (ranks may share a GPU)
//
// 1. Chapter 04's ring all-reduce (reduce-scatter then all-gather, N-1 sendrecv hops each, chunk
//    r of rank r's result complete after the first half) over DeviceComm::sendrecv, on integer-
//    valued floats (exact in float32 below 2^24, so every summation order gives the same bits):
//    the result must equal the exact sum, and the counters must show 2(N-1)/N · S bytes sent
//    per rank, as on the CPU (docs/memory.md).
// 2. all_reduce, reduce_scatter, all_gather: exact sums again.
// 3. all_reduce bus bandwidth (nccl-tests definitions: busbw = S / t · 2(N-1)/N).
// Exits 77 on every rank when a rank has no GPU to use (nccl: one per rank; staged: any).
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/check.hpp"
#include "common/gpu/device.hpp"
#include "common/gpu/nccl_comm.hpp"
#include "common/gpu/staged_comm.hpp"

using namespace ringzero;

namespace {

float value(int rank, int64_t i) {
  return static_cast<float>((rank + 1) * (i % 7));
}
float expected(int world_size, int64_t i) {
  return static_cast<float>(world_size * (world_size + 1) / 2 * (i % 7));
}

// The ring of chapter 04 (ring.hpp) on device pointers: chunk c = [c n/N, (c+1) n/N), the last
// takes the remainder. Reduce-scatter: at hop s rank r sends chunk (r - s) and adds the chunk
// (r - s - 1) it receives; all-gather: sends chunk (r + 1 - s), overwrites chunk (r - s).
void ring_all_reduce(DeviceComm& comm, float* buf, int64_t n, DeviceBuffer& tmp) {
  const int N = comm.world_size(), r = comm.rank();
  if (N == 1) return;
  auto begin = [&](int c) { return n / N * c; };
  auto size = [&](int c) { return c == N - 1 ? n - n / N * (N - 1) : n / N; };
  auto mod = [&](int x) { return ((x % N) + N) % N; };
  const int right = mod(r + 1), left = mod(r - 1);
  std::vector<float> a, b;
  for (int s = 0; s < N - 1; ++s) {
    const int send = mod(r - s), recv = mod(r - s - 1);
    comm.sendrecv(buf + begin(send), size(send), right, tmp.data(), size(recv), left);
    // add on the host copy: the test checks the transport, not a kernel
    a.resize(size(recv));
    b.resize(size(recv));
    ringzero::copy_to_host(a.data(), buf + begin(recv), size(recv) * 4);
    ringzero::copy_to_host(b.data(), tmp.data(), size(recv) * 4);
    for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
    copy_to_device(buf + begin(recv), a.data(), size(recv) * 4);
  }
  for (int s = 0; s < N - 1; ++s) {
    const int send = mod(r + 1 - s), recv = mod(r - s);
    comm.sendrecv(buf + begin(send), size(send), right, buf + begin(recv), size(recv), left);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Communicator comm(argc, argv);
  std::string transport = "nccl";
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--transport") transport = argv[i + 1];
  std::string why;
  const int devices = gpu_device_count(&why);
  const bool have = transport == "nccl" ? devices > comm.local_rank() : devices > 0;
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
    RZ_CHECK(transport == "nccl" || transport == "staged",
             "--transport " << transport << "; use nccl or staged");
    std::unique_ptr<DeviceComm> dc;
    if (transport == "nccl") {
      dc = std::make_unique<NcclCommunicator>(comm);
    } else {
      require_gpu(0);  // every rank on GPU 0: the staged transport lets them share it
      dc = std::make_unique<StagedCommunicator>(comm);
    }
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
      ring_all_reduce(*dc, in.data(), n * N, tmp);
      const auto after = dc->counters();
      auto sent = [](const std::map<std::string, Communicator::Counters>& m) {
        int64_t s = 0;
        for (auto& [op, c] : m) s += op == "metrics" ? 0 : c.bytes_sent;
        return s;
      };
      const int64_t S = n * N * 4, got = sent(after) - sent(before);
      // 2(N-1) chunks of S/N bytes (the last chunk of each rank's turn may be longer): the
      // exact number is Σ over the hops of the sent chunks' sizes.
      int64_t want = 0;
      for (int s = 0; s < N - 1; ++s) {
        const auto sz = [&](int c) { return c == N - 1 ? n * N - n * N / N * (N - 1) : n * N / N; };
        want += 4 * (sz(((r - s) % N + N) % N) + sz(((r + 1 - s) % N + N) % N));
      }
      RZ_CHECK(got == want, "ring bytes sent " << got << " != " << want << " (S = " << S << ")");
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
