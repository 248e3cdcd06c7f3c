// Graders for chapter 04's ring, under mpirun (scripts/exercise runs N = 1 and 3):
//
//   grade_ch04 reduce_scatter   04.1  ring_reduce_scatter: rank r ends with the reduced chunk r
//   grade_ch04 all_gather       04.2  ring_all_gather: every rank ends with every owner's chunk
//
// Lengths 10 (chunks 4, 4, 2: the ragged case that catches floor instead of ceil), 0, 2 (< N: an
// empty chunk at N = 3), 9 (divisible by 3) and 1001. Values are grade::tag_value: small
// integers, exact in float32 in any order, so results are compared bit for bit. The byte
// counters must equal the ring's definition: every chunk but one per phase. The same template
// also serves 16-bit values (--reduce-dtype bf16): each check is repeated on bf16 bits with
// values small enough to be exact in bf16 (integers below 256), so a region that adds with
// `+=` instead of the hop's `add`, or sends the wrong type, fails there.
// The ring runs over WatchedComm, not the Communicator: it counts the bytes itself and, when a
// hop's message does not come (a rank that sends to or receives from the wrong neighbour, or
// runs a different number of steps), every rank reports where it is — the collective, the
// length n, the step and the chunks it sends and awaits — and the grader stops within
// GRADE_HANG_SECONDS (default 10) instead of hanging until the caller's timeout.
#include <mpi.h>

#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "chapters/04_ring_allreduce/ring.hpp"
#include "exercises/graders/grade.hpp"
#include "exercises/graders/watched_comm.hpp"

using namespace ringzero;
using grade::WatchedComm;

namespace {

// The ragged case first, so that a ring that hangs does so where its chunks have names.
const std::vector<int64_t> kCounts = {10, 0, 2, 9, 1001};

// "n = 10, chunk 2 (elements [8, 10)), element 9"
std::string where(int64_t n, int N, int64_t i) {
  const int64_t s = (n + N - 1) / N;
  const int c = static_cast<int>(i / s);
  const Chunk k = ring_chunk(n, N, c);
  return "n = " + std::to_string(n) + ", chunk " + std::to_string(c) + " (elements [" +
         std::to_string(k.offset) + ", " + std::to_string(k.offset + k.size) + ")), element " +
         std::to_string(i);
}

void check_bytes(grade::Report& report, const WatchedComm& comm, int64_t n, int64_t want_sent,
                 int64_t want_received, const char* phase) {
  if (comm.bytes_sent != 4 * want_sent || comm.bytes_received != 4 * want_received)
    report.fail("n = " + std::to_string(n) + ": " + phase + " sent " +
                std::to_string(comm.bytes_sent) + " B and received " +
                std::to_string(comm.bytes_received) + " B; expected: the ring moves " +
                std::to_string(4 * want_sent) + " B out and " + std::to_string(4 * want_received) +
                " B in on this rank (every chunk but one, N - 1 steps)");
}

// The hop's add of ring.hpp's host overload (add_into), for the template over WatchedComm.
// A source of T converts to one of const T, as in the host overload's (T, const T) signature.
const auto kAdd = [](auto dst, auto src) {
  using T = typename decltype(dst)::element_type;
  add_into(dst, std::span<const T>(src));
};

int reduce_scatter_grader(WatchedComm& comm) {
  grade::Report report("04.1 ring reduce-scatter");
  const int N = comm.world_size(), r = comm.rank();
  for (int64_t n : kCounts) {
    std::vector<float> buf(n);
    for (int64_t i = 0; i < n; ++i) buf[i] = grade::tag_value(r, i);
    comm.begin(buf.data(), n, 4);
    ring_reduce_scatter(comm, std::span<float>(buf), std::span<float>(), kAdd);
    comm.end();
    const Chunk mine = ring_chunk(n, N, r);
    for (int64_t i = mine.offset; i < mine.offset + mine.size; ++i) {
      float expected = 0;
      for (int q = 0; q < N; ++q) expected += grade::tag_value(q, i);
      if (!report.bitwise(where(n, N, i), expected, buf[i],
                          "after the reduce-scatter rank r owns chunk r: the sum over all "
                          "ranks of that chunk (rank q contributes (q + 1)·1000 + i mod 1000, "
                          "so the thousands count the ranks that arrived)"))
        break;
    }
    check_bytes(report, comm, n, ring_reduce_scatter_sent(n, N, r),
                ring_reduce_scatter_received(n, N, r), "reduce-scatter");
  }
  for (int64_t n : kCounts) {  // the same template on bf16 values (common/core/half.hpp)
    std::vector<bf16> buf(n);
    for (int64_t i = 0; i < n; ++i) buf[i] = bf16::from_float(grade::small_value(r, i));
    comm.begin(buf.data(), n, 2);
    ring_reduce_scatter(comm, std::span<bf16>(buf), std::span<bf16>(), kAdd);
    comm.end();
    const Chunk mine = ring_chunk(n, N, r);
    for (int64_t i = mine.offset; i < mine.offset + mine.size; ++i) {
      float expected = 0;
      for (int q = 0; q < N; ++q) expected += grade::small_value(q, i);
      if (!report.bitwise("bf16 path, " + where(n, N, i), expected, static_cast<float>(buf[i]),
                          "the bf16 ring (the same code, T = bf16) adds in T's arithmetic: "
                          "widen, add in fp32, round once (bf16's += or the hop's `add`)"))
        break;
    }
  }
  return report.finish();
}

int all_gather_grader(WatchedComm& comm) {
  grade::Report report("04.2 ring all-gather");
  const int N = comm.world_size(), r = comm.rank();
  for (int64_t n : kCounts) {
    // Each rank holds only its own chunk (others poisoned with -1): after the all-gather every
    // element must hold its owner's value.
    std::vector<float> buf(n, -1.0f);
    const Chunk mine = ring_chunk(n, N, r);
    for (int64_t i = mine.offset; i < mine.offset + mine.size; ++i) buf[i] = grade::tag_value(r, i);
    comm.begin(buf.data(), n, 4);
    ring_all_gather(comm, std::span<float>(buf));
    comm.end();
    for (int64_t i = 0; i < n; ++i) {
      const int owner = static_cast<int>(i / ((n + N - 1) / N));
      if (!report.bitwise(where(n, N, i), grade::tag_value(owner, i), buf[i],
                          "after the all-gather every rank holds chunk c as its owner, rank c, "
                          "had it (-1 = never received)"))
        break;
    }
    check_bytes(report, comm, n, ring_all_gather_sent(n, N, r), ring_all_gather_received(n, N, r),
                "all-gather");
  }
  for (int64_t n : kCounts) {  // the same template on bf16 values
    std::vector<bf16> buf(n, bf16::from_float(-1.0f));
    const Chunk mine = ring_chunk(n, N, r);
    for (int64_t i = mine.offset; i < mine.offset + mine.size; ++i)
      buf[i] = bf16::from_float(grade::small_value(r, i));
    comm.begin(buf.data(), n, 2);
    ring_all_gather(comm, std::span<bf16>(buf));
    comm.end();
    for (int64_t i = 0; i < n; ++i) {
      const int owner = static_cast<int>(i / ((n + N - 1) / N));
      if (!report.bitwise("bf16 path, " + where(n, N, i), grade::small_value(owner, i),
                          static_cast<float>(buf[i]),
                          "the bf16 all-gather (the same code, T = bf16) copies every "
                          "owner's chunk (-1 = never received)"))
        break;
    }
  }
  return report.finish();
}

}  // namespace

int main(int argc, char** argv) {
  Communicator world(argc, argv);
  WatchedComm comm(world, {.hang = "(the ranks' ring steps do not pair up: each rank sends to "
                                   "r + 1 and receives from r − 1, N − 1 steps per phase)",
                           .mismatch = "(the ranks disagree on which chunk moves at this step: "
                                       "the sender's chunk is not the one the receiver awaits)",
                           .chunks = true});
  const std::string which = argc > 1 ? argv[1] : "";
  return grade::run_grader([&] {
    if (which == "reduce_scatter") return reduce_scatter_grader(comm);
    if (which == "all_gather") return all_gather_grader(comm);
    RZ_CHECK(false,
             "grade_ch04: unknown check '" << which << "'; use reduce_scatter or all_gather");
    return 2;
  });
}
