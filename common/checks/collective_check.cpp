#include "common/checks/collective_check.hpp"

#include <array>
#include <atomic>
#include <bit>
#include <cstdlib>
#include <cstring>

#include "common/core/check.hpp"
#include "common/driver/run.hpp"

namespace ringzero {

namespace {

bool env_says_on() {
  const char* v = std::getenv("RINGZERO_CHECK_COLLECTIVES");
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}

std::atomic<bool> g_enabled{env_says_on()};

// --check-collectives: read at validate, before any lesson object (which reads the switch when
// it is built) exists. The flag is compared across ranks like every other flag, so a rank that
// checks never waits for one that does not.
class CollectiveCheckFlag : public Extension {
 public:
  void add_flags(CommandLine& cli) override {
    on_ = collective_checks_enabled();
    cli.app
        .add_flag("--check-collectives", on_,
                  "before each collective, check every rank runs the same one (bucket/layer, "
                  "kind, size, order) and stop naming both if not (chapters 05-07; chapter 08 "
                  "always checks; like PyTorch's TORCH_DISTRIBUTED_DEBUG=DETAIL)")
        ->envname("RINGZERO_CHECK_COLLECTIVES");
  }
  void validate(const RunState&) override { set_collective_checks(on_); }

 private:
  bool on_ = false;
};

}  // namespace

bool collective_checks_enabled() {
  return g_enabled.load();
}
void set_collective_checks(bool on) {
  g_enabled.store(on);
}

void check_collective(Communicator& comm, const CollectiveHeader& mine,
                      const std::function<std::string(const CollectiveHeader&)>& describe,
                      const std::string& advice, const char* op) {
  const int N = comm.world_size(), r = comm.rank();
  if (N == 1) return;
  const int right = (r + 1) % N, left = (r + N - 1) % N;
  comm.count_call(op);
  Communicator::Scope scope(comm, op);
  std::array<float, 4> received{};  // the header's bytes; MPI copies them as they are
  comm.sendrecv(std::bit_cast<std::array<float, 4>>(mine), right, received, left);
  const auto theirs = std::bit_cast<CollectiveHeader>(received);
  RZ_CHECK(theirs == mine, "ranks out of step: " << describe(mine) << " on this rank, but "
                                                 << describe(theirs) << " on rank " << left << ". "
                                                 << advice);
}

CollectiveSequence::CollectiveSequence()
    : CollectiveSequence(
          collective_checks_enabled(), "metrics",  // optional: must not change the report
          describe_bucket,
          "Every rank must launch the same buckets in the same order (plan order, buckets.hpp): "
          "a rank that launches them in another order pairs different collectives across ranks, "
          "a crash inside MPI, a hang or silently different weights") {}

CollectiveSequence::CollectiveSequence(bool enabled, const char* op,
                                       std::function<std::string(const CollectiveHeader&)> describe,
                                       std::string advice)
    : enabled_(enabled), op_(op), describe_(std::move(describe)), advice_(std::move(advice)) {}

std::string CollectiveSequence::describe_bucket(const CollectiveHeader& h) {
  static const char* what[] = {"the all-reduce", "the reduce-scatter", "the all-gather"};
  return "collective #" + std::to_string(h.seq) + " is " +
         (h.kind < 3 ? what[h.kind] : "an unknown collective") + " of bucket " +
         std::to_string(h.id) + " (" + std::to_string(h.size) + " elements)";
}

std::unique_ptr<Extension> collective_check_extension() {
  return std::make_unique<CollectiveCheckFlag>();
}

}  // namespace ringzero
