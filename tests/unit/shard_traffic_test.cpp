// Chapter 06's traffic theory (chapters/06_zero1/shard.hpp's zero_traffic_theory) against
// chapter 04's ring, chunk by chunk. On a padded bucket every ring chunk is one shard, so the
// closed form, (N − 1)·s elements each way per collective, must equal what
// ring_reduce_scatter_sent/received and ring_all_gather_sent/received count for every rank;
// over plans with one bucket, one bucket per parameter, and buckets smaller than N (a bias of 3
// elements at N = 4 or 5), at N = 1..5 and the element bytes of fp32, bf16 and fp32-reduced
// bf16. And with MPI's collectives, the payload handed to MPI: the bucket less our block, and
// our block.
#include <utility>
#include <vector>

#include "chapters/06_zero1/shard.hpp"
#include "common/driver/train.hpp"

#include <catch2/catch.hpp>

using namespace ringzero;

TEST_CASE("zero_traffic_theory's closed form equals chapter 04's ring, chunk by chunk", "[shard]") {
  const Model model({7, 5, 3}, 1);                 // parameters 35, 5, 15, 3: Ψ = 58
  const std::vector<int64_t> caps = {4, 1 << 20};  // bytes: one bucket per parameter; one bucket
  for (int64_t cap : caps) {
    const std::vector<Bucket> plan = plan_buckets(parameter_sizes(model), cap, cap);
    for (int N = 1; N <= 5; ++N) {
      const ShardLayout layout = plan_shards(model, plan, 0, N);
      for (auto [g, p] : {std::pair{4, 4}, std::pair{2, 2}, std::pair{4, 2}}) {
        const TrafficTheory ring = zero_traffic_theory(layout, N, Collectives::ring, g, p);
        const TrafficTheory mpi = zero_traffic_theory(layout, N, Collectives::mpi, g, p);
        REQUIRE(ring.bytes_sent.size() == static_cast<size_t>(N));
        for (int r = 0; r < N; ++r) {
          int64_t sent = 0, received = 0, mpi_sent = 0, mpi_received = 0;
          for (const BucketShard& b : layout.buckets) {
            const int64_t n = b.padded_size(), s = n / N;
            sent += g * ring_reduce_scatter_sent(n, N, r) + p * ring_all_gather_sent(n, N, r);
            received +=
                g * ring_reduce_scatter_received(n, N, r) + p * ring_all_gather_received(n, N, r);
            mpi_sent += g * (n - s) + p * s;
            mpi_received += g * s + p * (n - s);
          }
          CAPTURE(cap, N, g, p, r);
          CHECK(ring.bytes_sent[r] == sent);
          CHECK(ring.bytes_received[r] == received);
          CHECK(mpi.bytes_sent[r] == mpi_sent);
          CHECK(mpi.bytes_received[r] == mpi_received);
        }
      }
    }
  }
}
