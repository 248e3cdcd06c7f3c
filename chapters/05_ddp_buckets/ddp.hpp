// DDP: gradient all-reduce in buckets, overlapped with backward (PyTorch's Reducer, small).
//
// Chapter 04 waits for the whole backward, then all-reduces every gradient. But the last
// layer's gradients are final long before the first layer's are computed. DDP registers a
// gradient-ready hook on every parameter; when the last parameter of a bucket (buckets.hpp)
// is ready, that bucket's all-reduce is launched on the communication thread
// (common/comm_thread.hpp) while the main thread carries on with backward:
//
//   main thread:  backward 4 ─▶ backward 2 ────────▶ backward 0 ──▶ finalize ▶ optimizer step
//   comm thread:            └─ all_reduce bucket 0 ─┘             └ all_reduce bucket 1 ┘
//
// Rules that keep every rank in step:
//  - buckets are launched strictly in plan order (bucket b only after b − 1), even if a later
//    bucket happens to be ready first, so every rank issues the same all-reduces in the same
//    order (PyTorch's Reducer does the same with its next_bucket_ counter);
//  - finalize_backward() waits for every bucket; each is divided by world_size on the comm
//    thread right after its all-reduce, so the optimizer sees the mean gradient, as in ch04;
//  - no_sync(): inside it, hooks do nothing and gradients just accumulate locally (chapter
//    02); the backward after it, on the last micro-step, all-reduces the accumulated sums;
//  - with --check-collectives, each all-reduce first checks that every rank is about to run the
//    same one, bucket, size and number (common/collective_check.hpp), so a rank out of order
//    stops every rank with a message instead of a crash inside MPI or different weights.
//
// Unused parameters: a parameter whose gradient never becomes ready would leave its bucket
// incomplete forever, and every rank would wait for it. finalize_backward() detects it; by
// default it fails on every rank with the names of those parameters (PyTorch raises "Expected
// to have finished reduction in the prior iteration ..."); with find_unused_parameters it
// marks them ready, which counts their missing gradient as zero, so their buckets complete.
// Before failing it waits for the buckets it already launched: every rank launched at least
// those of the rank that launched the fewest, so that rank always gets to abort the others.
// A bucket is a range of the gradients in their element type (float, bf16, fp16); the mean and
// the --reduce-dtype are the precision's (common/precision.hpp), the all-reduce chapter 04's.
// Leaves out: bucket rebuilding, comm hooks (compression), static graphs, broadcast buffers.
#pragma once

#include <algorithm>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "chapters/04_ring_allreduce/ring.hpp"
#include "chapters/05_ddp_buckets/buckets.hpp"
#include "common/collective_check.hpp"
#include "common/collectives.hpp"
#include "common/comm_thread.hpp"
#include "common/precision.hpp"
#include "common/train.hpp"
#include "common/trace.hpp"

namespace ringzero {

class DDP {
 public:
  struct Options {
    double bucket_cap_mb = 25.0;       ///< PyTorch's default
    double first_bucket_cap_mb = 1.0;  ///< PyTorch's dist._DEFAULT_FIRST_BUCKET_BYTES
    bool find_unused_parameters = false;
    Collectives collectives = Collectives::ring;  ///< ring (chapter 04's) | mpi (MPI_Allreduce,
                                                  ///< which spins while it waits)
    Tracer* tracer = nullptr;                     ///< optional: launch and all-reduce events
  };

  /// Plans the buckets, checks the plan is the same on every rank (collective), and hooks
  /// every parameter of `model`. comm, model and precision must outlive the DDP. `precision`:
  /// the run's, which holds the gradients, their mean and --reduce-dtype (built first, so that
  /// in 16 bits its hooks write the gradients before ours read them). Errors: --collectives mpi
  /// with a 16-bit --reduce-dtype (MPI has no bf16/fp16 sum).
  DDP(Communicator& comm, Model& model, Options options, ReplicatedPrecision& precision)
      : comm_(comm),
        model_(model),
        options_(options),
        precision_(precision),
        buckets_(plan_buckets(parameter_sizes(model), mib_to_bytes(options.bucket_cap_mb),
                              mib_to_bytes(options.first_bucket_cap_mb))) {
    RZ_CHECK(precision_.grad_wire_bytes() == 4 || options.collectives == Collectives::ring,
             "--collectives mpi with --reduce-dtype "
                 << dtype_name(precision_.dtype())
                 << " (--reduce-dtype defaults to the --precision): MPI has no "
                 << dtype_name(precision_.dtype())
                 << " sum; use --reduce-dtype fp32 (widen and sum in fp32) or --collectives ring");
    check_bucket_plans_match(comm, buckets_);
    const auto& params = model.parameters();
    bucket_of_.resize(params.size());
    int64_t largest_chunk = 0;
    for (size_t b = 0; b < buckets_.size(); ++b) {
      for (int p : buckets_[b].params) bucket_of_[p] = static_cast<int>(b);
      largest_chunk =
          std::max(largest_chunk, ring_chunk(buckets_[b].size, comm.world_size(), 0).size);
    }
    precision_.reserve_scratch(largest_chunk);  // (s) the ring's incoming chunk
    reset();
    for (size_t i = 0; i < params.size(); ++i)
      params[i]->add_grad_ready_hook([this, i](Parameter&) { mark_ready(static_cast<int>(i)); });
  }

  /// Waits for the communication thread and removes the hooks.
  ~DDP() {
    for (Parameter* p : model_.parameters()) p->clear_grad_ready_hooks();
  }
  DDP(const DDP&) = delete;
  DDP& operator=(const DDP&) = delete;

  const std::vector<Bucket>& buckets() const { return buckets_; }
  const Options& options() const { return options_; }
  /// The --explain-buckets table of this plan.
  std::string explain() const {
    return explain_buckets(buckets_, model_, options_.bucket_cap_mb, options_.first_bucket_cap_mb);
  }

  /// While a NoSync lives, backward accumulates gradients locally and communicates nothing
  /// (PyTorch's `with ddp.no_sync():`).
  class NoSync {
   public:
    explicit NoSync(DDP& ddp) : ddp_(ddp), previous_(std::exchange(ddp.require_sync_, false)) {}
    ~NoSync() { ddp_.require_sync_ = previous_; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DDP& ddp_;
    bool previous_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }

  /// After backward, before the optimizer step (PyTorch runs this as backward's final
  /// callback): handles unused parameters, waits until every bucket is all-reduced and
  /// divided by world_size. Does nothing inside no_sync(). Errors: unused parameters without
  /// find_unused_parameters (names them), a failed all-reduce.
  void finalize_backward() {
    // BEGIN EXERCISE 05.3 (no_sync: finalize)
    if (!require_sync_) return;
    // END EXERCISE 05.3
    std::string unused;
    for (size_t i = 0; i < ready_.size(); ++i)
      if (!ready_[i]) unused += (unused.empty() ? "" : ", ") + model_.parameters()[i]->name();
    if (!unused.empty() && options_.find_unused_parameters) {
      for (int i = static_cast<int>(ready_.size()) - 1; i >= 0; --i)
        if (!ready_[i]) mark_ready(i);  // their gradient for this backward: zero
    } else if (!unused.empty()) {
      comm_thread_.wait_all();  // the buckets launched so far: every rank launched them too
      reset();
      RZ_CHECK(
          false,
          "parameters that received no gradient in this backward: "
              << unused
              << ". Their buckets can never be all-reduced, and every rank would wait for them "
              << "forever. Make every parameter take part in the loss, or pass "
                 "--find-unused-parameters "
              << "(PyTorch: find_unused_parameters=True) to count a missing gradient as zero");
    }
    comm_thread_.wait_all();
    reset();
  }

  /// The parameter indices of the last synchronised backward, in the order their gradients
  /// became ready (for tests: reverse registration order, layer by layer).
  const std::vector<int>& last_ready_order() const { return last_ready_order_; }

 private:
  void reset() {
    ready_.assign(model_.parameters().size(), 0);
    pending_.clear();
    for (const Bucket& b : buckets_) pending_.push_back(static_cast<int>(b.params.size()));
    next_bucket_ = 0;
    if (!ready_order_.empty()) last_ready_order_ = std::exchange(ready_order_, {});
  }

  // The gradient-ready hook of parameter i (main thread, during backward).
  void mark_ready(int i) {
    // BEGIN EXERCISE 05.3 (no_sync: the hook)
    if (!require_sync_) return;
    // END EXERCISE 05.3
    RZ_CHECK(!ready_[i],
             "parameter "
                 << model_.parameters()[i]->name() << " became ready twice in one backward; "
                 << "call finalize_backward() after every backward that is not inside no_sync()");
    // BEGIN EXERCISE 05.2 (the gradient-ready hook launches buckets)
    ready_[i] = 1;
    ready_order_.push_back(i);
    --pending_[bucket_of_[i]];
    while (next_bucket_ < static_cast<int>(buckets_.size()) && pending_[next_bucket_] == 0)
      launch(next_bucket_++);
    // END EXERCISE 05.2
  }

  // Queues bucket b's all-reduce on the communication thread; returns at once.
  void launch(int b) {
    Tracer* tracer = options_.tracer;
    const double launched = tracer ? tracer->now_us() : 0;
    if (tracer) tracer->instant("launch bucket " + std::to_string(b), "ddp", Tracer::kMainTrack);
    const CollectiveHeader header = sequence_.next(CollectiveSequence::kAllReduce, b,
                                                   buckets_[b].size);  // --check-collectives
    comm_thread_.submit([this, b, tracer, launched, header] {
      sequence_.check(comm_, header);  // every rank runs this all-reduce now, or all stop
      const double start = tracer ? tracer->now_us() : 0;
      // The bucket's range of the gradients: summed by chapter 04's all-reduce, then the mean.
      const bool ring = options_.collectives == Collectives::ring;
      precision_.reduce(buckets_[b].offset, buckets_[b].size,
                        [&](auto grads, auto scratch) { all_reduce(comm_, grads, scratch, ring); });
      if (tracer)
        tracer->complete("all_reduce bucket " + std::to_string(b), "comm", Tracer::kCommTrack,
                         start, tracer->now_us() - start,
                         {{"bytes", precision_.grad_wire_bytes() * buckets_[b].size},
                          {"params", buckets_[b].params.size()},
                          {"queued_us", start - launched}});
    });
  }

  Communicator& comm_;
  Model& model_;
  Options options_;
  ReplicatedPrecision& precision_;  // the gradients, their mean and --reduce-dtype
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_;  // (P) bucket of each parameter
  std::vector<int> pending_;    // (buckets) parameters not ready yet in this backward
  std::vector<char> ready_;     // (P) 1 once the parameter's gradient is final
  std::vector<int> ready_order_, last_ready_order_;
  int next_bucket_ = 0;  // the next bucket to launch: launches happen in plan order
  bool require_sync_ = true;
  CollectiveSequence sequence_;    // numbers the all-reduces for --check-collectives
  friend struct BucketOrderFault;  // tests/tools/rank_fault.cpp: a rank out of order
  CommThread comm_thread_;         // last: destroyed (drained) first, while everything above lives
};

}  // namespace ringzero
