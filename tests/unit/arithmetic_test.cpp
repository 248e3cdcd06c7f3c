// Pure index arithmetic of the communication layer, no MPI needed: split_count (64-bit counts
// cut into MPI-sized pieces) and ring_chunk (chapter 04's chunking), including n = 0, n smaller
// than the world size and n beyond 2^31. Nothing here allocates n elements.
#include <climits>
#include <cstdint>

#include "chapters/04_ring_allreduce/ring.hpp"
#include "common/comm/comm.hpp"

#include <catch2/catch.hpp>

using namespace ringzero;
using Catch::Matchers::Contains;
using Pieces = std::vector<std::pair<int64_t, int64_t>>;

TEST_CASE("split_count cuts [0, n) into pieces of at most max_piece", "[comm][arith]") {
  REQUIRE(split_count(0).empty());
  REQUIRE(split_count(10, 3) == Pieces{{0, 3}, {3, 3}, {6, 3}, {9, 1}});
  REQUIRE(split_count(9, 3) == Pieces{{0, 3}, {3, 3}, {6, 3}});
  REQUIRE(split_count(5) == Pieces{{0, 5}});
  const int64_t two31 = int64_t{1} << 31;  // one past INT_MAX: the first count MPI cannot take
  REQUIRE(split_count(two31 - 1) == Pieces{{0, INT_MAX}});
  REQUIRE(split_count(two31) == Pieces{{0, INT_MAX}, {INT_MAX, 1}});
  REQUIRE(split_count(two31 + 5) == Pieces{{0, INT_MAX}, {INT_MAX, 6}});
  const int64_t big = 5'000'000'000;  // 5e9 = 2 INT_MAX + 705032706
  const Pieces p = split_count(big);
  REQUIRE(p == Pieces{{0, INT_MAX}, {INT_MAX, INT_MAX}, {2 * int64_t{INT_MAX}, 705032706}});
  REQUIRE_THROWS_WITH(split_count(-1), Contains("split_count(-1"));
  REQUIRE_THROWS(split_count(4, 0));
}

TEST_CASE("ring_chunk: ceil(n / N) chunks, trailing ones clipped or empty", "[ring][arith]") {
  auto chunks = [](int64_t n, int N) {
    std::vector<std::pair<int64_t, int64_t>> out;
    for (int i = 0; i < N; ++i)
      out.emplace_back(ring_chunk(n, N, i).offset, ring_chunk(n, N, i).size);
    return out;
  };
  REQUIRE(chunks(10, 4) == Pieces{{0, 3}, {3, 3}, {6, 3}, {9, 1}});
  REQUIRE(chunks(12, 4) == Pieces{{0, 3}, {3, 3}, {6, 3}, {9, 3}});
  REQUIRE(chunks(5, 4) == Pieces{{0, 2}, {2, 2}, {4, 1}, {5, 0}});  // last chunk empty
  REQUIRE(chunks(2, 4) == Pieces{{0, 1}, {1, 1}, {2, 0}, {2, 0}});  // n < N
  REQUIRE(chunks(0, 3) == Pieces{{0, 0}, {0, 0}, {0, 0}});          // n = 0
  REQUIRE(chunks(7, 1) == Pieces{{0, 7}});

  // Beyond 2^31: 3·2^31 + 1 elements over 4 ranks, s = 1610612737.
  const int64_t n = 3 * (int64_t{1} << 31) + 1;
  REQUIRE(chunks(n, 4) == Pieces{{0, 1610612737},
                                 {1610612737, 1610612737},
                                 {3221225474, 1610612737},
                                 {4831838211, 1610612734}});

  // Every (n, N) up to small sizes: chunks tile [0, n) in order, none longer than ceil(n / N).
  for (int64_t len = 0; len <= 40; ++len) {
    for (int N = 1; N <= 9; ++N) {
      int64_t next = 0;
      for (int i = 0; i < N; ++i) {
        const Chunk c = ring_chunk(len, N, i);
        REQUIRE(c.offset == next);
        REQUIRE(c.size >= 0);
        REQUIRE(c.size <= (len + N - 1) / N);
        next += c.size;
      }
      REQUIRE(next == len);
    }
  }
  REQUIRE(ring_mod(-1, 4) == 3);
  REQUIRE(ring_mod(-6, 4) == 2);
  REQUIRE(ring_mod(5, 4) == 1);
}
