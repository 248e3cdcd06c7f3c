// rank_fault: chapter 05, 06 or 07 (RZ_CHAPTER = 5, 6, 7 at compile time; binaries
// ch05_rank_fault, ...) with a test-only fault on one rank (--debug-fault-rank), for
// tests/chapters/collective_order.sh and tests/chapters/nonfinite_gradient.sh.
//
// Out of order: the rank launches its buckets' collectives in another order than the others,
// as a hook that launches buckets as they become ready (instead of in plan order) would on a
// rank whose gradients arrive in another order:
//   --debug-bucket-order reverse   the last bucket first (bug hunt 05.b2's fault)
//   --debug-bucket-order swap      the first two buckets of equal length change places, so
//                                  every collective still has the length the others expect
// With --check-collectives (common/checks/collective_check.hpp) every rank must stop within seconds
// naming the collective, the buckets and the ranks; without it the first crashes inside MPI or
// hangs, and the second trains on with different weights on each rank.
//
//   mpirun -np 2 build/bin/ch05_rank_fault --model toy --bucket-cap-mb 4 --check-collectives
//       --debug-fault-rank 1 --debug-bucket-order swap --max-steps 3   (one command line)
//
// Non-finite gradient (--debug-inf-weight-step S): in step S, right after the second Linear
// layer's forward, the rank sets that layer's first weight to +inf. Its loss stays finite (the
// layers after it already ran), but backward through that weight makes the earlier layer's
// gradient non-finite on this rank only: the gradient scan (common/checks/finite_check.hpp) must
// name step S and this rank, though every rank's loss turns NaN only at step S + 1.
//
// The fault is an Extension (common/driver/run.hpp) that re-registers the gradient-ready hooks of
// the faulty rank: the chapter itself carries no test machinery, only a friend declaration.
#include <algorithm>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#if RZ_CHAPTER == 5
#include "chapters/05_ddp_buckets/step.hpp"
#elif RZ_CHAPTER == 6
#include "chapters/06_zero1/step.hpp"
#elif RZ_CHAPTER == 7
#include "chapters/07_zero2/step.hpp"
#else
#error "compile with -DRZ_CHAPTER=5, 6 or 7"
#endif
#include "common/driver/run.hpp"

namespace ringzero {

// Named friend of DDP and of chapters 06-07's ZeRO: chapter 05's mark_ready, unchanged, but
// its launches held back until backward has completed every bucket, then issued in `order`.
struct BucketOrderFault {
  // order[k]: the bucket this rank launches k-th (a permutation of the plan's buckets).
  template <class D>
  static void install(D& d, Model&, std::vector<int> order) {
    BucketReadiness& r = readiness(d.readiness_);
    r.launch_ = [launch = r.launch_, order, held = std::make_shared<size_t>(0)](int) {
      if (++*held < order.size()) return;  // every bucket is complete only after the last
      *held = 0;
      for (int b : order) launch(b);
    };
  }
  template <class D>
  static std::vector<int64_t> sizes(const D& d) {
    return bucket_sizes(d.buckets_);
  }
  static BucketReadiness& readiness(BucketReadiness& r) { return r; }
  static BucketReadiness& readiness(std::optional<BucketReadiness>& r) { return *r; }
};

}  // namespace ringzero

using namespace ringzero;

namespace {

#if RZ_CHAPTER == 5
using Training = DDPTraining;
using Flags = DDPFlags;
const Chapter kChapter{.name = "05_ddp_buckets",
                       .title = "DDP with one rank launching buckets out of order (tests only)",
                       .trace = true};
#elif RZ_CHAPTER == 6
using Training = Zero1Training<>;
using Flags = ZeroBucketFlags;
const Chapter kChapter{.name = "06_zero1",
                       .title = "ZeRO-1 with one rank launching buckets out of order (tests only)",
                       .optimizer_state = true,
                       .trace = true};
#else
using Training = Zero2Training<>;
using Flags = ZeroBucketFlags;
const Chapter kChapter{.name = "07_zero2",
                       .title = "ZeRO-2 with one rank launching buckets out of order (tests only)",
                       .optimizer_state = true,
                       .trace = true};
#endif

class OutOfOrder : public Extension {
 public:
  void add_flags(CommandLine& cli) override {
    cli.app.add_option("--debug-fault-rank", rank_, "the rank with the fault")->required();
    cli.app.add_option("--debug-bucket-order", order_, "reverse | swap (two equal-size buckets)")
        ->check(CLI::IsMember({"plan", "reverse", "swap"}));
    cli.app.add_option("--debug-inf-weight-step", inf_step_,
                       "in this step, after layer 2's forward, its first weight becomes +inf");
  }
  void after_setup(RunState& state) override {
    if (state.rank != rank_) return;
    if (inf_step_ > 0) {
      const RunState* s = &state;
      Linear* layer = state.model->linear_layers().at(1);
      layer->add_post_forward_hook([s, layer, step = inf_step_](Module&) {
        if (s->step == step) layer->weight.data.data()[0] = std::numeric_limits<float>::infinity();
      });
    }
    if (order_ == "plan") return;
    auto& d = static_cast<Training&>(*state.lesson).engine;
    const std::vector<int64_t> sizes = BucketOrderFault::sizes(d);
    std::vector<int> order(sizes.size());
    std::iota(order.begin(), order.end(), 0);
    RZ_CHECK(sizes.size() >= 2, "--debug-bucket-order needs 2 buckets or more; the plan has "
                                    << sizes.size() << ": lower --bucket-cap-mb");
    if (order_ == "reverse") {
      std::reverse(order.begin(), order.end());
    } else {
      bool swapped = false;
      for (size_t a = 0; a < sizes.size() && !swapped; ++a)
        for (size_t b = a + 1; b < sizes.size() && !swapped; ++b)
          if (sizes[a] == sizes[b]) {
            std::swap(order[a], order[b]);
            swapped = true;
          }
      RZ_CHECK(swapped,
               "--debug-bucket-order swap: no two buckets of equal length in this plan "
               "(use --model toy --bucket-cap-mb 4)");
    }
    BucketOrderFault::install(d, *state.model, order);
  }

 private:
  int rank_ = -1;
  std::string order_ = "plan";
  int64_t inf_step_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  Run run(argc, argv, kChapter);
  run.add_extension(std::make_unique<OutOfOrder>());
  Flags flags;
  return run.train<Training>(
      flags, +[](Training& lesson, const Step& step) { return train_step(lesson.engine, step); });
}
