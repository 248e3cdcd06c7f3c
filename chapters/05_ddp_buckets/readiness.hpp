// readiness: when a bucket's gradients are complete, and the rules that keep every rank in step
// while buckets are launched during backward. Chapter 05's idea, written once: DDP (ddp.hpp)
// all-reduces what it launches, ZeRO-1 and ZeRO-2 (chapters 06, 07) reduce-scatter it.
//
// A gradient-ready hook on every parameter counts down its bucket; when the last parameter of
// a bucket (buckets.hpp) is ready, the engine's launch(b) queues that bucket's collective on the
// communication thread while the main thread carries on with backward.
//
// Rules that keep every rank in step:
//  - buckets are launched strictly in plan order (bucket b only after b − 1), even if a later
//    bucket happens to be ready first, so every rank issues the same collectives in the same
//    order (PyTorch's Reducer does the same with its next_bucket_ counter);
//  - finalize_backward() waits for every bucket, so the optimizer sees the reduced gradients;
//  - require_sync false (nanoGPT's require_backward_grad_sync, PyTorch's no_sync()): the hooks
//    and finalize_backward() do nothing and gradients just accumulate locally (chapter 02); the
//    backward with require_sync true, on the last micro-step, reduces the accumulated sums.
//
// Unused parameters: a parameter whose gradient never becomes ready would leave its bucket
// incomplete forever, and every rank would wait for it. finalize_backward() detects it; by
// default it fails on every rank with the names of those parameters (PyTorch raises "Expected
// to have finished reduction in the prior iteration ..."); with find_unused_parameters it
// marks them ready, which counts their missing gradient as zero, so their buckets complete.
// Before failing it waits for the buckets it already launched: every rank launched at least
// those of the rank that launched the fewest, so that rank always gets to abort the others.
// Leaves out: bucket rebuilding, static graphs.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "chapters/05_ddp_buckets/buckets.hpp"
#include "common/checks/unused_parameters.hpp"
#include "common/core/check.hpp"
#include "common/core/nn.hpp"

namespace ringzero {

/// Which buckets are complete in this backward, launching them in plan order; the parameters'
/// gradient-ready hooks are its own (removed on destruction). Main thread only.
class BucketReadiness {
 public:
  /// launch(b): queue bucket b's collective, return at once. wait_all(): wait until every queued
  /// collective is done. reduced: what the collective does to a bucket, for the unused-parameter
  /// message ("all-reduced", "reduce-scattered"). model and buckets must outlive it.
  BucketReadiness(Model& model, const std::vector<Bucket>& buckets, bool find_unused_parameters,
                  std::string reduced, std::function<void(int)> launch,
                  std::function<void()> wait_all)
      : model_(model),
        buckets_(buckets),
        find_unused_parameters_(find_unused_parameters),
        reduced_(std::move(reduced)),
        launch_(std::move(launch)),
        wait_all_(std::move(wait_all)) {
    const auto& params = model.parameters();
    bucket_of_.resize(params.size());
    for (size_t b = 0; b < buckets.size(); ++b)
      for (int p : buckets[b].params) bucket_of_[p] = static_cast<int>(b);
    reset();
    for (size_t i = 0; i < params.size(); ++i)
      params[i]->add_grad_ready_hook([this, i](Parameter&) { mark_ready(static_cast<int>(i)); });
  }
  ~BucketReadiness() {
    for (Parameter* p : model_.parameters()) p->clear_grad_ready_hooks();
  }
  BucketReadiness(const BucketReadiness&) = delete;
  BucketReadiness& operator=(const BucketReadiness&) = delete;

  /// false: the next backwards only accumulate (PyTorch's no_sync()); true: the next backward
  /// reduces. Set it before each micro-step's backward: `set_require_sync(micro_step == K - 1)`.
  void set_require_sync(bool sync) { require_sync_ = sync; }

  /// After backward, before the optimizer step (PyTorch runs this as backward's final
  /// callback): handles unused parameters and waits until every bucket's collective is done.
  /// Returns false, having done nothing, when require_sync is false. Errors: unused parameters
  /// without find_unused_parameters (names them), a failed collective.
  bool finalize_backward() {
    // BEGIN EXERCISE 05.3 (no_sync: finalize)
    if (!require_sync_) return false;
    // END EXERCISE 05.3
    const std::string unused = unused_parameter_names(model_.parameters(), ready_);
    if (!unused.empty() && find_unused_parameters_) {
      for (int i = static_cast<int>(ready_.size()) - 1; i >= 0; --i)
        if (!ready_[i]) mark_ready(i);  // their gradient for this backward: zero
    } else if (!unused.empty()) {
      wait_all_();  // the buckets launched so far: every rank launched them too
      reset();
      check_unused_parameters(unused, false,
                              "Their buckets can never be " + reduced_ +
                                  ", and every rank would wait for them forever");
    }
    wait_all_();
    reset();
    return true;
  }

  /// The bucket that parameter i (registration order) is in.
  int bucket_of(int i) const { return bucket_of_[i]; }

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
             "parameter " << model_.parameters()[i]->name()
                          << " became ready twice in one backward; call finalize_backward() "
                             "after every backward that reduces (require_sync true)");
    // BEGIN EXERCISE 05.2 (the gradient-ready hook launches buckets)
    ready_[i] = 1;
    ready_order_.push_back(i);
    --pending_[bucket_of_[i]];
    while (next_bucket_ < static_cast<int>(buckets_.size()) && pending_[next_bucket_] == 0)
      launch_(next_bucket_++);
    // END EXERCISE 05.2
  }

  Model& model_;
  const std::vector<Bucket>& buckets_;
  bool find_unused_parameters_;
  std::string reduced_;
  std::function<void(int)> launch_;
  std::function<void()> wait_all_;
  std::vector<int> bucket_of_;  // (P) bucket of each parameter
  std::vector<int> pending_;    // (buckets) parameters not ready yet in this backward
  std::vector<char> ready_;     // (P) 1 once the parameter's gradient is final
  std::vector<int> ready_order_, last_ready_order_;
  int next_bucket_ = 0;  // the next bucket to launch: launches happen in plan order
  bool require_sync_ = true;
  friend struct BucketOrderFault;  // tests/tools/rank_fault.cpp: a rank out of order
};

}  // namespace ringzero
