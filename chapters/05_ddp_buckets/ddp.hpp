// DDP: gradient all-reduce in buckets, overlapped with backward (PyTorch's Reducer, small).
//
// Chapter 04 waits for the whole backward, then all-reduces every gradient. But the last
// layer's gradients are final long before the first layer's are computed. DDP registers a
// gradient-ready hook on every parameter; when the last parameter of a bucket (buckets.hpp)
// is ready, that bucket's all-reduce is launched on the communication thread
// (common/comm_queue.hpp) while the main thread carries on with backward:
//
//   main thread:  backward 4 ─▶ backward 2 ────────▶ backward 0 ──▶ finalize ▶ optimizer step
//   comm thread:            └─ all_reduce bucket 0 ─┘             └ all_reduce bucket 1 ┘
//
// When a bucket is complete, in which order buckets go, no_sync and unused parameters:
// readiness.hpp (BucketReadiness, shared with chapters 06 and 07). Here: what a launched bucket
// does, every rank's optimizer (its own ReplicatedPrecision), describe(), and the chapter's
// ledger formula and traffic theory. With --check-collectives, each all-reduce first checks
// that every rank is about to run the same one, bucket, size and number (common/collective_check.hpp), so a rank out of order
// stops every rank with a message instead of a crash inside MPI or different weights.
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
#include "chapters/05_ddp_buckets/options.hpp"
#include "chapters/05_ddp_buckets/readiness.hpp"
#include "common/collective_check.hpp"
#include "common/collectives.hpp"
#include "common/comm_queue.hpp"
#include "common/engine_description.hpp"
#include "common/metrics.hpp"
#include "common/precision.hpp"
#include "common/train.hpp"
#include "common/trace.hpp"
#include "common/zero_memory.hpp"

namespace ringzero {

class DDP {
 public:
  using Options = DDPOptions;  // options.hpp

  /// Builds every rank's optimizer (the same on each, as chapter 04's), plans the buckets,
  /// checks the plan is the same on every rank (collective), and hooks every parameter of
  /// `model`. comm and model must outlive the DDP. Errors: --collectives mpi with a 16-bit
  /// --reduce-dtype (MPI has no bf16/fp16 sum); as ReplicatedPrecision's.
  DDP(Communicator& comm, Model& model, const TrainConfig& config, Options options)
      : comm_(comm),
        model_(model),
        options_(options),
        precision_(model, config, comm.world_size()),
        states_(fp32_state_bytes(config.optimizer, config.momentum)),
        buckets_(plan_buckets(parameter_sizes(model), mib_to_bytes(options.bucket_cap_mb),
                              mib_to_bytes(options.first_bucket_cap_mb))) {
    RZ_CHECK(precision_.grad_wire_bytes() == 4 || options.collectives == Collectives::ring,
             "--collectives mpi with --reduce-dtype "
                 << dtype_name(precision_.dtype())
                 << " (--reduce-dtype defaults to the --precision): MPI has no "
                 << dtype_name(precision_.dtype())
                 << " sum; use --reduce-dtype fp32 (widen and sum in fp32) or --collectives ring");
    check_bucket_plans_match(comm, buckets_);
    int64_t largest_chunk = 0;
    for (const Bucket& b : buckets_)
      largest_chunk = std::max(largest_chunk, ring_chunk(b.size, comm.world_size(), 0).size);
    precision_.reserve_scratch(largest_chunk);  // (s) the ring's incoming chunk
  }

  DDP(const DDP&) = delete;
  DDP& operator=(const DDP&) = delete;

  Communicator& comm() const { return comm_; }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  const Options& options() const { return options_; }
  /// The --explain-buckets table of this plan.
  std::string explain() const {
    return explain_buckets(buckets_, model_, options_.bucket_cap_mb, options_.first_bucket_cap_mb);
  }
  /// Every rank's optimizer, the same on each (common/precision.hpp): the gradients, their
  /// mean and --reduce-dtype, the loss scale, the backward seed.
  ReplicatedPrecision& optimizer() { return precision_; }
  const ReplicatedPrecision& optimizer() const { return precision_; }

  void zero_grad() { precision_.zero_grad(); }
  /// After finalize_backward(): the same optimizer step on every rank (--clip-grad-norm first).
  void step() { precision_.step(&comm_); }

  /// false: the next backwards accumulate locally and send nothing (PyTorch's no_sync());
  /// true: the next backward all-reduces (readiness.hpp).
  void set_require_sync(bool sync) { readiness_.set_require_sync(sync); }

  /// After backward, before the optimizer step: every bucket all-reduced and divided by
  /// world_size (readiness.hpp: unused parameters, errors). Does nothing when require_sync is
  /// false.
  void finalize_backward() { readiness_.finalize_backward(); }

  /// What this engine is, as data (common/engine_description.hpp): no ZeRO stage, buckets.
  EngineDescription describe() const {
    return {.zero_stage = 0,
            .unit = "buckets",
            .unit_sizes = bucket_sizes(buckets_),  // in launch order
            .collectives = options_.collectives,
            .world_size = comm_.world_size(),
            .reset_ledger_peaks = precision_.reset_ledger_peaks()};  // 16 bits: the masters
  }
  /// The ledger's formula line: every rank holds the full model states (below).
  std::string ledger_formula() const;
  /// What every rank should move per step: chapter 04's ring per bucket (below).
  TrafficTheory traffic_theory() const;

  /// The parameter indices of the last synchronised backward, in the order their gradients
  /// became ready (for tests: reverse registration order, layer by layer).
  const std::vector<int>& last_ready_order() const { return readiness_.last_ready_order(); }

 private:
  // Queues bucket b's all-reduce on the communication thread; returns at once.
  void launch(int b) {
    const Bucket& bucket = buckets_[b];
    const CollectiveHeader header = sequence_.next(CollectiveSequence::kAllReduce, b, bucket.size);
    comm_queue_.submit(
        {.name = "all_reduce bucket " + std::to_string(b),
         .args = {{"bytes", precision_.grad_wire_bytes() * bucket.size},
                  {"params", bucket.params.size()}},
         .posted = "launch bucket " + std::to_string(b),
         .category = "ddp",
         .queued_us = true},
        [this, header] { sequence_.check(comm_, header); },  // every rank runs it now, or all stop
        [this, &bucket] {  // the bucket's gradients: chapter 04's all-reduce, then the mean
          const bool ring = options_.collectives == Collectives::ring;
          precision_.reduce(bucket.offset, bucket.size, [&](auto grads, auto scratch) {
            all_reduce(comm_, grads, scratch, ring);
          });
        });
  }

  Communicator& comm_;
  Model& model_;
  Options options_;
  // First of the hooked members: in 16 bits its hooks write the gradients before ours read them.
  ReplicatedPrecision precision_;  // the gradients, their mean and --reduce-dtype
  StateBytes states_;              // bytes per parameter in fp32: p, g and --optimizer's state
  std::vector<Bucket> buckets_;
  BucketReadiness readiness_{model_, buckets_, options_.find_unused_parameters, "all-reduced",
                             [this](int b) { launch(b); }, [this] { comm_queue_.wait_all(); }};
  CollectiveSequence sequence_;    // numbers the all-reduces for --check-collectives
  friend struct BucketOrderFault;  // tests/tools/rank_fault.cpp: a rank out of order
  CommQueue comm_queue_{options_.tracer};  // last: drained first, while everything above lives
};

// What the driver reports: the chapter's theory of memory and traffic.

inline std::string DDP::ledger_formula() const {
  const double psi = static_cast<double>(model_.num_parameters());
  if (!precision_.is_fp32()) {
    const bool half = precision_.grad_wire_bytes() == 2;
    return "formula (" + std::string(dtype_name(precision_.dtype())) +
           " + AdamW with fp32 master weights, every rank): 2Ψ + 2Ψ + 12Ψ = 16Ψ = " +
           human_bytes(16.0 * psi) + "; comm_buffers: " +
           (half ? "one 16-bit chunk of the largest bucket"
                 : "the gradient widened to fp32, 4Ψ, and one fp32 chunk of the largest "
                   "bucket") +
           "; activations: one layer's fp32 working copy and gradient scratch";
  }
  return "formula (" + std::string(states_.name) +
         ", every rank): " + full_copy_formula_text(states_) + " = " +
         human_bytes(states_.per_param() * psi) +
         "; comm_buffers: one chunk of the largest bucket";
}

inline TrafficTheory DDP::traffic_theory() const {
  const int N = comm_.world_size();
  const int64_t psi = model_.num_parameters();
  if (options_.collectives == Collectives::mpi)  // MPI does not report its wire traffic
    return {std::vector<int64_t>(N, 4 * psi), std::vector<int64_t>(N, 4 * psi),
            "MPI_Allreduce: the counters show the Ψ·4 = " + human_bytes(4.0 * psi) +
                " handed to MPI per step"};
  TrafficTheory theory = ring_all_reduce_traffic(bucket_sizes(buckets_), N,
                                                 precision_.grad_wire_bytes());  // ch. 04's
  theory.formula += "; counted per bucket here: " + std::to_string(buckets_.size()) +
                    " all-reduces instead of " + std::to_string(model_.parameters().size()) +
                    ", the same bytes";
  return theory;
}

}  // namespace ringzero
