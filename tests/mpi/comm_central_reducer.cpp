// Chapter 03's central reducer (chapters/03_data_parallel/central_reducer.hpp) under mpirun,
// np 1..4: rank 0 ends with the exact sum of every rank's gradients (integer-valued floats,
// so exact in any order), the other ranks' gradients are untouched, the broadcast copies rank
// 0's parameters everywhere, and the counters show the star exactly: rank 0 moves (N − 1)·Ψ·4
// bytes in and (N − 1)·Ψ·4 out, every other rank Ψ·4 each way.
#include <vector>

#include "chapters/03_data_parallel/central_reducer.hpp"
#include "mpi/test_comm.hpp"

#include <catch2/catch.hpp>

using namespace ringzero;

TEST_CASE("central reducer: exact sum on rank 0, copy back, counters", "[central_reducer]") {
  Communicator& comm = test_comm();
  const int N = comm.world_size(), r = comm.rank();
  for (int64_t psi : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{100003}}) {
    INFO("psi = " << psi << ", world_size = " << N << ", rank = " << r);
    std::vector<float> grads(static_cast<size_t>(psi)), params(static_cast<size_t>(psi));
    for (int64_t i = 0; i < psi; ++i) {
      grads[i] = static_cast<float>((r + 1) * (i % 11 + 1));
      params[i] = r == 0 ? static_cast<float>(i % 17) : -1.0f;
    }
    std::vector<float> scratch(static_cast<size_t>(psi));
    comm.reset_counters();
    reduce_to_rank0(comm, std::span<float>(grads), std::span<float>(scratch));
    for (int64_t i = 0; i < psi; ++i) {
      const float expected = r == 0 ? static_cast<float>(N * (N + 1) / 2 * (i % 11 + 1))
                                    : static_cast<float>((r + 1) * (i % 11 + 1));
      if (grads[i] != expected)
        FAIL("grads[" << i << "] = " << grads[i] << ", expected " << expected);
    }
    broadcast_from_rank0(comm, std::span<float>(params));
    for (int64_t i = 0; i < psi; ++i)
      if (params[i] != static_cast<float>(i % 17)) FAIL("params[" << i << "] = " << params[i]);

    const auto& c = comm.counters();
    const int64_t star = (r == 0 ? N - 1 : 1) * psi * 4;  // the formula the chapter prints
    REQUIRE(c.at("central_reduce").calls == 1);
    REQUIRE(c.at("central_broadcast").calls == 1);
    REQUIRE(c.at("central_reduce").bytes_received == (r == 0 ? star : 0));
    REQUIRE(c.at("central_reduce").bytes_sent == (r == 0 ? 0 : star));
    REQUIRE(c.at("central_broadcast").bytes_sent == (r == 0 ? star : 0));
    REQUIRE(c.at("central_broadcast").bytes_received == (r == 0 ? 0 : star));
    REQUIRE(comm.training_traffic().bytes_sent == star);
    REQUIRE(comm.training_traffic().bytes_received == star);
  }
  comm.reset_counters();
}
