// Ring all-reduce (chapters/04_ring_allreduce/ring.hpp) under mpirun, np 1..4:
//  - equals MPI_Allreduce bit for bit on integer-valued floats (sums of small integers are exact
//    in float32 whatever the order, so any difference is a wrong chunk, not rounding), for
//    counts that are 0, smaller than N (empty chunks), not divisible by N, and 2^20 + 3;
//  - after the reduce-scatter phase alone, rank r holds exactly the reduced chunk it owns;
//  - the byte and message counters equal the theory exactly, written here from the definition
//    (a rank sends every chunk but one per phase), not from ring.hpp's helpers alone.
#include <cstring>
#include <vector>

#include "chapters/04_ring_allreduce/ring.hpp"
#include "mpi/test_comm.hpp"

#include <catch2/catch.hpp>

using namespace ringzero;

namespace {
const std::vector<int64_t> kCounts = {0, 1, 2, 3, 5, 7, 1000, (int64_t{1} << 20) + 3};

// Rank r's value at element i: an integer in [1, 4 * 13], different per rank and element.
float value(int rank, int64_t i) {
  return static_cast<float>((rank + 1) * (i % 13 + 1));
}
float expected_sum(int world_size, int64_t i) {
  float s = 0;
  for (int q = 0; q < world_size; ++q) s += value(q, i);
  return s;
}
std::vector<float> rank_values(int rank, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = value(rank, i);
  return v;
}
}  // namespace

TEST_CASE("ring_all_reduce equals MPI_Allreduce exactly", "[ring]") {
  Communicator& comm = test_comm();
  for (int64_t n : kCounts) {
    INFO("n = " << n << ", world_size = " << comm.world_size() << ", rank = " << comm.rank());
    std::vector<float> ours = rank_values(comm.rank(), n), theirs = ours;
    ring_all_reduce(comm, std::span<float>(ours));
    comm.all_reduce(theirs);
    REQUIRE(std::memcmp(ours.data(), theirs.data(), ours.size() * sizeof(float)) == 0);
    for (int64_t i = 0; i < n; ++i)
      if (ours[i] != expected_sum(comm.world_size(), i)) FAIL("element " << i << ": " << ours[i]);
    // With a caller-owned scratch buffer (what training loops pass): the same result.
    std::vector<float> again = rank_values(comm.rank(), n);
    Buffer scratch(ring_chunk(n, comm.world_size(), 0).size, MemTag::comm_buffers);
    ring_all_reduce(comm, std::span<float>(again), scratch.span());
    REQUIRE(std::memcmp(again.data(), theirs.data(), again.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("after ring_reduce_scatter, rank r holds exactly its reduced chunk", "[ring]") {
  Communicator& comm = test_comm();
  const int N = comm.world_size(), r = comm.rank();
  for (int64_t n : kCounts) {
    INFO("n = " << n << ", world_size = " << N << ", rank = " << r);
    std::vector<float> buf = rank_values(r, n);
    ring_reduce_scatter(comm, std::span<float>(buf));
    const Chunk mine = ring_chunk(n, N, r);
    for (int64_t i = mine.offset; i < mine.offset + mine.size; ++i)
      if (buf[i] != expected_sum(N, i))
        FAIL("element " << i << " of chunk " << r << ": " << buf[i]);
    // The all-gather alone then completes the all-reduce from the owned chunks.
    ring_all_gather(comm, std::span<float>(buf));
    for (int64_t i = 0; i < n; ++i)
      if (buf[i] != expected_sum(N, i)) FAIL("after all-gather, element " << i << ": " << buf[i]);
  }
}

TEST_CASE("ring counters equal the theory exactly", "[ring]") {
  Communicator& comm = test_comm();
  const int N = comm.world_size(), r = comm.rank();
  for (int64_t n : kCounts) {
    INFO("n = " << n << ", world_size = " << N << ", rank = " << r);
    std::vector<float> buf = rank_values(r, n);
    comm.reset_counters();
    ring_all_reduce(comm, std::span<float>(buf));
    const auto& c = comm.counters();
    // Definition: per phase a rank sends N − 1 chunks, every chunk but one: in the
    // reduce-scatter all but its own (r), in the all-gather all but its successor's (r + 1).
    auto size = [&](int chunk) { return ring_chunk(n, N, ((chunk % N) + N) % N).size; };
    const int64_t rs_sent = N == 1 ? 0 : n - size(r), rs_recv = N == 1 ? 0 : n - size(r - 1);
    const int64_t ag_sent = N == 1 ? 0 : n - size(r + 1), ag_recv = N == 1 ? 0 : n - size(r);
    int64_t rs_msgs = 0, ag_msgs = 0;  // sendrecv counts a message only for a non-empty piece
    for (int chunk = 0; chunk < N; ++chunk) {  // every chunk but r, and every chunk but r + 1
      rs_msgs += chunk != r && size(chunk) > 0;
      ag_msgs += chunk != (r + 1) % N && size(chunk) > 0;
    }
    REQUIRE(c.at("ring_reduce_scatter").calls == 1);
    REQUIRE(c.at("ring_all_gather").calls == 1);
    if (N > 1) {
      REQUIRE(c.at("ring_reduce_scatter").bytes_sent == 4 * rs_sent);
      REQUIRE(c.at("ring_reduce_scatter").bytes_received == 4 * rs_recv);
      REQUIRE(c.at("ring_all_gather").bytes_sent == 4 * ag_sent);
      REQUIRE(c.at("ring_all_gather").bytes_received == 4 * ag_recv);
      REQUIRE(c.at("ring_reduce_scatter").messages_sent == rs_msgs);
      REQUIRE(c.at("ring_all_gather").messages_sent == ag_msgs);
      // ring.hpp's helpers (used by chapter 04's printed theory) agree with the definition.
      REQUIRE(ring_reduce_scatter_sent(n, N, r) == rs_sent);
      REQUIRE(ring_reduce_scatter_received(n, N, r) == rs_recv);
      REQUIRE(ring_all_gather_sent(n, N, r) == ag_sent);
      REQUIRE(ring_all_gather_received(n, N, r) == ag_recv);
      // When N divides n: exactly (N − 1)·n/N elements per phase, the 2(N − 1)/N of the README.
      if (n % N == 0) REQUIRE(rs_sent + ag_sent == 2 * (N - 1) * (n / N));
    }
    REQUIRE(comm.training_traffic().bytes_sent == 4 * (rs_sent + ag_sent));
    // Over all ranks, every element is sent N − 1 times per phase.
    std::vector<double> total = {static_cast<double>(comm.training_traffic().bytes_sent)};
    comm.all_reduce_metrics(total);
    REQUIRE(total[0] == 4.0 * 2 * (N - 1) * n);
  }
  comm.reset_counters();
}
