// DDP: gradient all-reduce in buckets, overlapped with backward (PyTorch's Reducer, small).
//
// Chapter 04 waits for the whole backward, then all-reduces every gradient. But the last
// layer's gradients are final long before the first layer's are computed. DDP registers a
// gradient-ready hook on every parameter; when the last parameter of a bucket (buckets.hpp)
// is ready, that bucket's all-reduce is launched on the communication thread
// (common/comm/comm_queue.hpp) while the main thread carries on with backward:
//
//   main thread:  backward 4 ─▶ backward 2 ────────▶ backward 0 ──▶ finalize ▶ optimizer step
//   comm thread:            └─ all_reduce bucket 0 ─┘             └ all_reduce bucket 1 ┘
//
// When a bucket is complete, in which order buckets go, no_sync and unused parameters:
// readiness.hpp (BucketReadiness, shared with chapters 06 and 07). Here: what a launched bucket
// does, every rank's optimizer (its own ReplicatedPrecision), describe(), and the traffic
// theory (chapter 04's ring, per bucket; the ledger formula is chapter 04's too). With
// --check-collectives, the communication queue first checks that every rank is about to run
// the same all-reduce (common/comm/comm_queue.hpp), so a rank out of order stops every rank with a
// message instead of a crash inside MPI or different weights.
// A bucket is a range of the gradients in their element type (float, bf16, fp16); the mean and
// the --reduce-dtype are the precision's (common/precision/precision.hpp), the all-reduce chapter
// 04's. Leaves out: bucket rebuilding, comm hooks (compression), static graphs, broadcast buffers.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "chapters/04_ring_allreduce/ring.hpp"
#include "chapters/05_ddp_buckets/buckets.hpp"
#include "chapters/05_ddp_buckets/options.hpp"
#include "chapters/05_ddp_buckets/readiness.hpp"
#include "common/comm/collectives.hpp"
#include "common/comm/comm_queue.hpp"
#include "common/driver/engine_description.hpp"
#include "common/driver/train.hpp"
#include "common/precision/precision.hpp"
#include "common/report/metrics.hpp"

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
        buckets_(plan_buckets(parameter_sizes(model), mib_to_bytes(options.bucket_cap_mb),
                              mib_to_bytes(options.first_bucket_cap_mb))) {
    precision_.check_collectives(options.collectives);  // MPI has no 16-bit sum
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
  /// Every rank's optimizer, the same on each (common/precision/precision.hpp): the gradients,
  /// their mean and --reduce-dtype, the loss scale, the backward seed.
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

  /// What this engine is, as data (common/driver/engine_description.hpp): no ZeRO stage, buckets.
  EngineDescription describe() const {
    return {.zero_stage = 0,
            .unit = "buckets",
            .unit_sizes = bucket_sizes(buckets_),  // in launch order
            .collectives = options_.collectives,
            .world_size = comm_.world_size(),
            .reset_ledger_peaks = precision_.reset_ledger_peaks()};  // 16 bits: the masters
  }
  /// The ledger's formula line: every rank holds the full model states, as in chapter 04.
  std::string ledger_formula() const { return precision_.replicated_ledger_formula("bucket"); }
  /// What every rank should move per step: chapter 04's ring (or MPI's), per bucket.
  TrafficTheory traffic_theory() const {
    if (options_.collectives == Collectives::mpi)
      return mpi_all_reduce_traffic(model_.num_parameters(), comm_.world_size());
    TrafficTheory theory = ring_all_reduce_traffic(bucket_sizes(buckets_), comm_.world_size(),
                                                   precision_.grad_wire_bytes());
    theory.formula += "; counted per bucket here: " + std::to_string(buckets_.size()) +
                      " all-reduces instead of " + std::to_string(model_.parameters().size()) +
                      ", the same bytes";
    return theory;
  }

  /// The parameter indices of the last synchronised backward, in the order their gradients
  /// became ready (for tests: reverse registration order, layer by layer).
  const std::vector<int>& last_ready_order() const { return readiness_.last_ready_order(); }

 private:
  // Queues bucket b's all-reduce on the communication thread (checked across ranks first with
  // --check-collectives, traced with --trace: common/comm/comm_queue.hpp); returns at once.
  void launch(int b) {
    const Bucket& bucket = buckets_[b];
    comm_queue_.submit(
        {.kind = CollectiveSequence::kAllReduce, .unit = b, .elements = bucket.size,
         .bytes = precision_.grad_wire_bytes() * bucket.size, .params = std::ssize(bucket.params)},
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
  std::vector<Bucket> buckets_;
  BucketReadiness readiness_{model_, buckets_, options_.find_unused_parameters, "all-reduced",
                             [this](int b) { launch(b); }, [this] { comm_queue_.wait_all(); }};
  friend struct BucketOrderFault;  // tests/tools/rank_fault.cpp: a rank out of order
  CommQueue comm_queue_{comm_, options_.tracer, bucket_naming("ddp")};  // last: drained first
};

}  // namespace ringzero
