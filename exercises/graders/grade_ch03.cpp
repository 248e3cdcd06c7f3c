// Graders for chapter 03's central reducer, under mpirun (scripts/exercise runs N = 1 and 3):
//
//   grade_ch03 reduce      03.1  reduce_to_rank0: rank 0 ends with Σ_q g_q, in rank order
//   grade_ch03 broadcast   03.2  broadcast_from_rank0: every rank ends with rank 0's params
//
// Values are grade::tag_value(rank, element): small integers, exact in float32, so any
// difference is a missing rank or a misplaced element, never rounding (compared bit for bit).
// The traffic counters are checked against the star's definition: rank 0 receives (N-1)·n
// floats, every other rank sends n (reduce), and the mirror image for the broadcast.
// Each check is repeated on bf16 values (grade::small_value: exact in bf16, and so are their
// sums), the template chapter 03 runs with --precision bf16.
// The star runs over grade::WatchedComm (watched_comm.hpp): a message that never comes (a
// send without its receive, rank 0 sending to itself) stops every rank within
// GRADE_HANG_SECONDS (default 10), each naming its collective, n and the message it waits on.
#include <string>
#include <vector>

#include "chapters/03_data_parallel/central_reducer.hpp"
#include "exercises/graders/grade.hpp"
#include "exercises/graders/watched_comm.hpp"

using namespace ringzero;
using grade::WatchedComm;

namespace {

const std::vector<int64_t> kCounts = {0, 1, 7, 10, 1000};

int reduce_grader(WatchedComm& comm) {
  grade::Report report("03.1 central reducer (gather and sum on rank 0)");
  const int N = comm.world_size(), r = comm.rank();
  for (int64_t n : kCounts) {
    std::vector<float> grads(n), scratch(n, -1.0f);
    for (int64_t i = 0; i < n; ++i) grads[i] = grade::tag_value(r, i);
    comm.begin(grads.data(), n, 4);
    reduce_to_rank0(comm, std::span<float>(grads), std::span<float>(scratch));
    comm.end();
    const std::string where = "n = " + std::to_string(n) + ", element ";
    for (int64_t i = 0; i < n; ++i) {
      float expected = grade::tag_value(r, i);  // ranks 1..N-1 keep their own gradients
      if (r == 0) {
        expected = 0;
        for (int q = 0; q < N; ++q) expected += grade::tag_value(q, i);
      }
      if (!report.bitwise(where + std::to_string(i), expected, grads[i],
                          r == 0 ? "rank 0 holds the sum over all ranks (no average here: the "
                                   "caller divides by N)"
                                 : "ranks other than 0 send and leave their gradients alone"))
        break;  // the first wrong element of each n tells the story
    }
    const WatchedComm& c = comm;
    const int64_t want_in = r == 0 ? (N - 1) * n * 4 : 0, want_out = r == 0 ? 0 : n * 4;
    if (c.bytes_received != want_in || c.bytes_sent != want_out)
      report.fail("n = " + std::to_string(n) + ": sent " + std::to_string(c.bytes_sent) +
                  " B, received " + std::to_string(c.bytes_received) + " B; the star moves " +
                  std::to_string(want_out) + " B out and " + std::to_string(want_in) +
                  " B in on this rank (rank 0 receives Ψ·4 from each other rank)");
  }
  for (int64_t n : kCounts) {  // the same template on bf16 values (--precision bf16)
    std::vector<bf16> grads(n), scratch(n, bf16::from_float(-1.0f));
    for (int64_t i = 0; i < n; ++i) grads[i] = bf16::from_float(grade::small_value(r, i));
    comm.begin(grads.data(), n, 2);
    reduce_to_rank0(comm, std::span<bf16>(grads), std::span<bf16>(scratch));
    comm.end();
    for (int64_t i = 0; i < n; ++i) {
      float expected = grade::small_value(r, i);
      if (r == 0) {
        expected = 0;
        for (int q = 0; q < N; ++q) expected += grade::small_value(q, i);
      }
      if (!report.bitwise("bf16 path, n = " + std::to_string(n) + ", element " + std::to_string(i),
                          expected, static_cast<float>(grads[i]),
                          "the bf16 star (the same code, T = bf16): rank 0 adds each rank's "
                          "gradient with add_into (widen, add in fp32, round once)"))
        break;
    }
  }
  return report.finish();
}

int broadcast_grader(WatchedComm& comm) {
  grade::Report report("03.2 central reducer (broadcast from rank 0)");
  const int N = comm.world_size(), r = comm.rank();
  for (int64_t n : kCounts) {
    std::vector<float> params(n);
    for (int64_t i = 0; i < n; ++i) params[i] = grade::tag_value(r, i);
    comm.begin(params.data(), n, 4);
    broadcast_from_rank0(comm, std::span<float>(params));
    comm.end();
    for (int64_t i = 0; i < n; ++i)
      if (!report.bitwise("n = " + std::to_string(n) + ", element " + std::to_string(i),
                          grade::tag_value(0, i), params[i],
                          "every rank continues from rank 0's parameters"))
        break;
    const WatchedComm& c = comm;
    const int64_t want_out = r == 0 ? (N - 1) * n * 4 : 0, want_in = r == 0 ? 0 : n * 4;
    if (c.bytes_received != want_in || c.bytes_sent != want_out)
      report.fail("n = " + std::to_string(n) + ": sent " + std::to_string(c.bytes_sent) +
                  " B, received " + std::to_string(c.bytes_received) + " B; expected " +
                  std::to_string(want_out) + " B out and " + std::to_string(want_in) +
                  " B in (rank 0 sends Ψ·4 to each other rank)");
  }
  for (int64_t n : kCounts) {  // the same template on bf16 values
    std::vector<bf16> params(n);
    for (int64_t i = 0; i < n; ++i) params[i] = bf16::from_float(grade::small_value(r, i));
    comm.begin(params.data(), n, 2);
    broadcast_from_rank0(comm, std::span<bf16>(params));
    comm.end();
    for (int64_t i = 0; i < n; ++i)
      if (!report.bitwise("bf16 path, n = " + std::to_string(n) + ", element " + std::to_string(i),
                          grade::small_value(0, i), static_cast<float>(params[i]),
                          "every rank continues from rank 0's 16-bit parameters"))
        break;
  }
  return report.finish();
}

}  // namespace

int main(int argc, char** argv) {
  Communicator world(argc, argv);
  WatchedComm comm(world, {.hang = "(every send needs exactly one matching receive on the other "
                                   "rank: rank 0 receives from each of ranks 1..N−1 in turn, or "
                                   "sends to each of them)",
                           .mismatch = "(the message's length is not the one awaited)"});
  const std::string which = argc > 1 ? argv[1] : "";
  return grade::run_grader([&] {
    if (which == "reduce") return reduce_grader(comm);
    if (which == "broadcast") return broadcast_grader(comm);
    RZ_CHECK(false, "grade_ch03: unknown check '" << which << "'; use reduce or broadcast");
    return 2;
  });
}
