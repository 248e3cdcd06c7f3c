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
// does. With --check-collectives, each all-reduce first checks that every rank is about to run
// the same one, bucket, size and number (common/collective_check.hpp), so a rank out of order
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
#include "chapters/05_ddp_buckets/readiness.hpp"
#include "common/collective_check.hpp"
#include "common/collectives.hpp"
#include "common/comm_queue.hpp"
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
    int64_t largest_chunk = 0;
    for (const Bucket& b : buckets_)
      largest_chunk = std::max(largest_chunk, ring_chunk(b.size, comm.world_size(), 0).size);
    precision_.reserve_scratch(largest_chunk);  // (s) the ring's incoming chunk
  }

  DDP(const DDP&) = delete;
  DDP& operator=(const DDP&) = delete;

  const std::vector<Bucket>& buckets() const { return buckets_; }
  const Options& options() const { return options_; }
  /// The --explain-buckets table of this plan.
  std::string explain() const {
    return explain_buckets(buckets_, model_, options_.bucket_cap_mb, options_.first_bucket_cap_mb);
  }

  /// false: the next backwards accumulate locally and send nothing (PyTorch's no_sync());
  /// true: the next backward all-reduces (readiness.hpp).
  void set_require_sync(bool sync) { readiness_.set_require_sync(sync); }

  /// After backward, before the optimizer step: every bucket all-reduced and divided by
  /// world_size (readiness.hpp: unused parameters, errors). Does nothing when require_sync is
  /// false.
  void finalize_backward() { readiness_.finalize_backward(); }

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
  ReplicatedPrecision& precision_;  // the gradients, their mean and --reduce-dtype
  std::vector<Bucket> buckets_;
  BucketReadiness readiness_{model_, buckets_, options_.find_unused_parameters, "all-reduced",
                             [this](int b) { launch(b); }, [this] { comm_queue_.wait_all(); }};
  CollectiveSequence sequence_;    // numbers the all-reduces for --check-collectives
  friend struct BucketOrderFault;  // tests/tools/rank_fault.cpp: a rank out of order
  CommQueue comm_queue_{options_.tracer};  // last: drained first, while everything above lives
};

}  // namespace ringzero
