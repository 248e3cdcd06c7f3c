// The 16-bit ring all-reduce (chapters/04_ring_allreduce/ring.hpp) under mpirun, np 1..4:
//  - every hop adds in float32 and rounds once to 16 bits: the result equals, BIT FOR BIT, a
//    serial re-enactment written here from the documented rule (chunk c's sum starts at rank
//    c + 1 and adds ranks c + 2, ..., c, rounding after each addition), on every rank;
//  - the counters show half the fp32 ring's bytes: 2(N − 1)/N · n · 2 exactly when N divides n;
//  - how much a 16-bit ring sum loses against an fp32 sum of the same 16-bit inputs (printed;
//    chapter 04's README quotes the np 4 figures), with the textbook bound for recursive
//    summation (Higham, "Accuracy and Stability of Numerical Algorithms", §4.2): the error is
//    at most (N − 1) u Σ_q |x_q| to first order, u = 2^-8 (bf16) or 2^-11 (fp16); the test
//    allows N u Σ|x_q| (the fp32 reference's own rounding and second-order terms).
#include <cmath>
#include <cstdio>
#include <vector>

#include "chapters/04_ring_allreduce/ring.hpp"
#include "common/core/rng.hpp"
#include "mpi/test_comm.hpp"

#include <catch2/catch.hpp>

using namespace ringzero;

namespace {

// Rank q's gradient-like values: normal, scale 1e-3, 16-bit; any rank can make any rank's.
std::vector<uint16_t> rank_values(Dtype d, int q, int64_t n, float mean = 0.0f) {
  Rng rng(14, 100 + static_cast<uint64_t>(q));
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (auto& h : v) h = float_to_half(d, (mean + rng.normal()) * 1e-3f);
  return v;
}

// The 16-bit ring (chapter 04's, written over the element type) on bits of format d.
void ring_all_reduce_bits(Communicator& comm, std::span<uint16_t> bits, Dtype d) {
  if (d == Dtype::bf16)
    ring_all_reduce(comm, as_elements<bf16>(bits));
  else
    ring_all_reduce(comm, as_elements<fp16>(bits));
}

}  // namespace

TEST_CASE("16-bit ring: each hop adds in fp32 and rounds once, in ring order", "[ring][half]") {
  Communicator& comm = test_comm();
  const int N = comm.world_size(), r = comm.rank();
  for (Dtype d : {Dtype::bf16, Dtype::fp16}) {
    for (int64_t n : {int64_t{0}, int64_t{3}, int64_t{1000}, int64_t{4096 * 3 + 1}}) {
      INFO(dtype_name(d) << ", n = " << n << ", world_size = " << N << ", rank = " << r);
      std::vector<uint16_t> buf = rank_values(d, r, n);
      ring_all_reduce_bits(comm, buf, d);
      std::vector<std::vector<uint16_t>> all;
      for (int q = 0; q < N; ++q) all.push_back(rank_values(d, q, n));
      for (int c = 0; c < N; ++c) {
        const Chunk ch = ring_chunk(n, N, c);
        for (int64_t i = ch.offset; i < ch.offset + ch.size; ++i) {
          uint16_t acc = all[static_cast<size_t>((c + 1) % N)][i];
          for (int k = 2; k <= N; ++k) {
            const float sum =
                half_to_float(d, acc) + half_to_float(d, all[static_cast<size_t>((c + k) % N)][i]);
            acc = float_to_half(d, sum);
          }
          if (buf[i] != acc) FAIL("element " << i << ": got " << buf[i] << ", expected " << acc);
        }
      }
    }
  }
}

TEST_CASE("16-bit ring sends half the bytes of the fp32 ring", "[ring][half]") {
  Communicator& comm = test_comm();
  const int N = comm.world_size();
  const int64_t n = 4096 * 3 * 4;  // divisible by 1, 2, 3, 4
  std::vector<uint16_t> h = rank_values(Dtype::bf16, comm.rank(), n);
  std::vector<float> f(h.size());
  convert_to_float(Dtype::bf16, h, f);
  comm.reset_counters();
  ring_all_reduce_bits(comm, h, Dtype::bf16);
  const int64_t half_bytes = comm.training_traffic().bytes_sent;
  comm.reset_counters();
  ring_all_reduce(comm, std::span<float>(f));
  const int64_t fp32_bytes = comm.training_traffic().bytes_sent;
  REQUIRE(half_bytes == 2 * (N - 1) * (n / N) * 2);
  REQUIRE(fp32_bytes == 2 * half_bytes);
  REQUIRE(comm.training_traffic().bytes_received == fp32_bytes);
}

TEST_CASE("16-bit ring sum vs fp32 sum: the measured loss", "[ring][half]") {
  Communicator& comm = test_comm();
  const int N = comm.world_size();
  const int64_t n = 1 << 16;
  for (Dtype d : {Dtype::bf16, Dtype::fp16}) {
    for (float mean : {0.0f, 3.0f}) {  // mixed signs (cancellation), then mostly one sign
      std::vector<uint16_t> h = rank_values(d, comm.rank(), n, mean);
      std::vector<float> f(h.size()), mag(h.size());
      convert_to_float(d, h, f);  // the same 16-bit inputs, summed in fp32
      for (size_t i = 0; i < f.size(); ++i) mag[i] = std::abs(f[i]);
      ring_all_reduce_bits(comm, h, d);
      ring_all_reduce(comm, std::span<float>(f));
      ring_all_reduce(comm, std::span<float>(mag));  // Σ_q |x_q|
      double err_sum = 0, err_max = 0;
      int64_t counted = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (mag[i] == 0) continue;  // every input 0 (fp16 underflow): the sum is exactly 0
        const double rel = std::abs(half_to_float(d, h[i]) - f[i]) / mag[i];
        err_sum += rel;
        err_max = std::max(err_max, rel);
        ++counted;
      }
      const double mean_rel = err_sum / static_cast<double>(counted);
      if (comm.rank() == 0)
        std::printf(
            "16-bit ring sum vs fp32 sum, %s, N = %d, inputs mean %.0fe-3 sd 1e-3: "
            "error / sum|x|: mean %.3g, max %.3g\n",
            dtype_name(d), N, mean, mean_rel, err_max);
      const double u = d == Dtype::bf16 ? 0x1p-8 : 0x1p-11;  // unit roundoff
      if (N == 1) REQUIRE(err_max == 0.0);
      REQUIRE(err_max <= N * u);
      if (N > 1) REQUIRE(mean_rel > 0);  // the 16-bit hops do round
    }
  }
}
