// grad_scaler: fp16 dynamic loss scaling (--precision fp16), torch.cuda.amp.GradScaler's
// defaults and update rule, with the overflow decision taken over every rank.
//
// fp16's largest value is 65504 and its smallest normal 2^-14, so small gradients flush to zero
// unless backward is seeded with a scale (loss scaling: Micikevicius et al. 2018, "Mixed
// Precision Training", §3.2); the dynamic rule, halve and skip on overflow, double after a run of
// clean steps, is torch.cuda.amp.GradScaler's. Every 16-bit optimizer holds one in fp16:
// MixedPrecision (chapters 01-05, mixed_precision.hpp, through precision.hpp), ShardOptimizer (06-07, shard_precision.hpp), Zero3 (08).
#pragma once

#include <cstdint>

#include "common/comm/comm.hpp"

namespace ringzero {

/// local on any rank -> true on every rank (one MPI_Allreduce of one double, counted as
/// "metrics": it is a control message, not gradient traffic).
bool found_inf_on_any_rank(Communicator& comm, bool local);

/// torch.cuda.amp.GradScaler's defaults.
struct GradScalerOptions {
  float init_scale = 65536.0f;  ///< 2^16
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  int64_t growth_interval = 2000;
};

/// fp16 dynamic loss scaling (torch.cuda.amp.GradScaler, torch._amp_update_scale_): backward
/// is seeded with scale(); the optimizer sees the gradients times inv_scale(); after each step
/// update(found_inf) skips the step (returns false) and halves the scale when any gradient
/// on any rank overflowed, else counts a clean step and doubles the scale after
/// growth_interval clean steps in a row. The scale is a power of two, so scaling and
/// unscaling are exact (short of over/underflow).
class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});
  float scale() const { return scale_; }
  /// 1 / scale in fp32 (torch: scale.double().reciprocal().float()).
  float inv_scale() const { return static_cast<float>(1.0 / static_cast<double>(scale_)); }
  /// Returns whether the optimizer step is to be taken (no overflow), then updates the scale.
  bool update(bool found_inf);
  int64_t skipped_steps() const { return skipped_; }
  int64_t growth_tracker() const { return growth_tracker_; }
  /// Restores a saved state (a checkpoint's; torch's GradScaler.load_state_dict: "scale",
  /// "_growth_tracker"), so the resumed run scales and skips as the uninterrupted one.
  /// Errors: a scale that is not finite and positive, negative counts.
  void load_state(float scale, int64_t growth_tracker, int64_t skipped_steps);

 private:
  GradScalerOptions options_;
  float scale_;
  int64_t growth_tracker_ = 0, skipped_ = 0;
};

}  // namespace ringzero
