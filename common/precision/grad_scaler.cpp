#include "common/precision/grad_scaler.hpp"

#include <array>
#include <cmath>

#include "common/core/check.hpp"

namespace ringzero {

bool found_inf_on_any_rank(Communicator& comm, bool local) {
  std::array<double, 1> flag{local ? 1.0 : 0.0};
  comm.all_reduce_metrics(flag);
  return flag[0] > 0.0;
}

GradScaler::GradScaler(GradScalerOptions options) : options_(options), scale_(options.init_scale) {
  RZ_CHECK(options.init_scale > 0 && std::isfinite(options.init_scale),
           "GradScaler init_scale = " << options.init_scale << " must be positive and finite");
  RZ_CHECK(options.growth_factor > 1, "GradScaler growth_factor must be > 1");
  RZ_CHECK(options.backoff_factor > 0 && options.backoff_factor < 1,
           "GradScaler backoff_factor must lie in (0, 1)");
  RZ_CHECK(options.growth_interval > 0, "GradScaler growth_interval must be positive");
}

bool GradScaler::update(bool found_inf) {
  if (found_inf) {
    scale_ *= options_.backoff_factor;
    growth_tracker_ = 0;
    skipped_ += 1;
    return false;
  }
  if (++growth_tracker_ == options_.growth_interval) {
    scale_ *= options_.growth_factor;
    growth_tracker_ = 0;
  }
  return true;
}

void GradScaler::load_state(float scale, int64_t growth_tracker, int64_t skipped_steps) {
  RZ_CHECK(std::isfinite(scale) && scale > 0,
           "GradScaler: a saved scale of " << scale << " (finite and positive expected)");
  RZ_CHECK(growth_tracker >= 0 && growth_tracker < options_.growth_interval,
           "GradScaler: a saved growth tracker of " << growth_tracker << " (0.."
                                                    << options_.growth_interval - 1 << " expected)");
  RZ_CHECK(skipped_steps >= 0,
           "GradScaler: a saved count of " << skipped_steps << " skipped steps (>= 0 expected)");
  scale_ = scale;
  growth_tracker_ = growth_tracker;
  skipped_ = skipped_steps;
}

}  // namespace ringzero
