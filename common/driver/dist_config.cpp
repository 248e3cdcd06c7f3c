#include "common/driver/dist_config.hpp"

#include <algorithm>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "common/core/check.hpp"
#include "common/core/ledger.hpp"
#include "common/driver/config.hpp"

namespace ringzero {

void broadcast_and_verify_parameters(Communicator& comm, Model& model) {
  const int N = comm.world_size(), r = comm.rank();
  std::span<float> params = model.params_memory.span();
  // In pieces, so the check costs a small fixed buffer rather than a second copy of the model.
  constexpr int64_t kPiece = int64_t{1} << 16;
  Buffer received(std::min(kPiece, model.num_parameters()),
                  MemTag::comm_buffers);  // (piece) rank 0's values
  int64_t first = -1;
  float mine_at_first = 0, rank0_at_first = 0;
  for (auto [off, n] : split_count(model.num_parameters(), kPiece)) {
    std::span<float> piece = received.span().first(static_cast<size_t>(n));
    std::copy_n(params.begin() + off, n, piece.begin());
    comm.broadcast(piece, /*root=*/0);
    // Bit for bit: the same seed and code give the same bits, and anything else is a launch bug.
    for (int64_t i = 0; i < n && first < 0; ++i)
      if (std::memcmp(&piece[i], &params[off + i], sizeof(float)) != 0) {
        first = off + i;
        mine_at_first = params[off + i];
        rank0_at_first = piece[i];
      }
  }
  std::vector<double> mismatch(static_cast<size_t>(N), 0.0);  // (N) 1 where a rank differs
  mismatch[r] = first >= 0 ? 1.0 : 0.0;
  comm.all_reduce_metrics(mismatch);
  std::string ranks;
  for (int q = 0; q < N; ++q)
    if (mismatch[q] != 0) ranks += (ranks.empty() ? "" : ", ") + std::to_string(q);
  if (ranks.empty()) return;
  const int reporter =
      static_cast<int>(std::find(mismatch.begin(), mismatch.end(), 1.0) - mismatch.begin());
  if (r != reporter) {
    comm.barrier();  // never completes: the reporter aborts every rank (one message, not N)
    return;
  }
  std::string where = "element " + std::to_string(first);
  for (size_t p = 0; p < model.parameters().size(); ++p) {
    const int64_t off = model.offsets()[p], n = model.parameters()[p]->numel();
    if (first >= off && first < off + n)
      where = model.parameters()[p]->name() + "[" + std::to_string(first - off) + "]";
  }
  RZ_CHECK(
      false,
      "rank(s) " << ranks
                 << " started with initial parameters different from rank 0's (first difference "
                 << "on rank " << r << " at " << where << ": " << mine_at_first << " here, "
                 << rank0_at_first << " on rank 0); every rank must build the model from the "
                 << "same --seed and --init-from: launch all ranks with the same command line");
}

void check_on_every_rank(Communicator* comm, const std::function<void()>& checks) {
  if (comm == nullptr) return checks();
  std::string failure;  // this rank's message, "" when its checks passed
  try {
    checks();
  } catch (const Error& e) {  // already "[rank r/N] file:line: ..."
    failure = e.what();
  } catch (const std::exception& e) {
    failure = "[rank " + std::to_string(comm->rank()) + "/" + std::to_string(comm->world_size()) +
              "] error: " + e.what();
  }
  const std::vector<std::string> all = comm->gather_strings(failure, 0);
  std::string verdict;
  for (const std::string& message : all)
    if (!message.empty()) verdict += "\n  " + message;
  comm->broadcast_string(verdict, 0);  // every rank stops, with the same messages
  RZ_CHECK(verdict.empty(), "a start-up check failed, so every rank stops before step 1:"
                                << verdict);
}

int parse_flags_on_every_rank(Communicator& comm, CLI::App& app, int argc, char** argv) {
  const int rc = parse_flags(app, argc, argv);
  std::vector<double> stopping = {rc >= 0 ? 1.0 : 0.0};
  comm.all_reduce_metrics(stopping);
  if (stopping[0] == 0 || stopping[0] == comm.world_size()) return rc;
  return run_main([&]() -> int {
    RZ_CHECK(false,
             (rc >= 0 ? "this rank stops at its flag error or --help (above)"
                      : "a flag error on another rank (its message is above) stops this one too")
                 << "; every rank must run the same command line");
    return 1;
  });
}

void verify_same_flags(Communicator& comm, const CLI::App& app,
                       const std::vector<std::string>& checked_elsewhere) {
  // One "name=value" line per option, defaults included, in registration order: the same text
  // on every rank exactly when the parsed flags are the same, whatever their spelling on argv.
  std::string mine;
  std::istringstream lines(app.config_to_str(/*default_also=*/true, /*write_description=*/false));
  for (std::string line; std::getline(lines, line);) {
    const std::string name = line.substr(0, line.find('='));
    if (std::find(checked_elsewhere.begin(), checked_elsewhere.end(), name) ==
        checked_elsewhere.end())
      mine += line + "\n";
  }
  const std::vector<std::string> all = comm.gather_strings(mine, 0);
  std::string verdict;  // empty: all equal
  for (size_t r = 1; r < all.size() && verdict.empty(); ++r) {
    if (all[r] == all[0]) continue;
    std::istringstream a(all[0]), b(all[r]);
    std::string la, lb;
    while (std::getline(a, la) && std::getline(b, lb) && la == lb) {
    }
    verdict = "rank " + std::to_string(r) + " has " + (lb.empty() ? "other flags" : lb) +
              ", rank 0 has " + (la.empty() ? "other flags" : la) +
              "; every rank must run the same command line";
  }
  comm.broadcast_string(verdict, 0);  // every rank stops, with the same message
  RZ_CHECK(verdict.empty(), verdict);
}

}  // namespace ringzero
