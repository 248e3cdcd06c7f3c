// Gradient clipping over shards: torch.nn.utils.clip_grad_norm_ when each rank holds only its
// shard of the reduced gradient (chapters 06-08).
// Leaves out: clipping a whole local gradient (common/core/optim.hpp's clip_grad_norm).
#pragma once

#include <cmath>
#include <span>
#include <vector>

#include "common/comm/comm.hpp"
#include "common/core/optim.hpp"

namespace ringzero {

/// Collective: `sums` (N) holds this rank's Σ g² at [rank] and zeros elsewhere; every rank
/// receives every rank's (exact: the others add zeros), adds them in rank order and returns the
/// square root: the global L2 norm, the same on every rank. Counted as "metrics".
inline double sum_in_rank_order(Communicator& comm, std::vector<double>& sums) {
  comm.all_reduce_metrics(sums);
  double total = 0;
  for (double v : sums) total += v;
  return std::sqrt(total);
}

/// Collective, after the gradients are reduced: scales `shards` (this rank's real gradient
/// elements, every bucket or layer) so that the global L2 norm of the gradient is at most
/// max_norm (torch.nn.utils.clip_grad_norm_, with its 1e-6); returns the norm before
/// clipping. Every rank receives every rank's Σ g² over its shards (exact: the others add
/// zeros) and adds them in rank order, so every rank gets the same norm. It equals the
/// unsharded norm up to float64 rounding (another summation order, ~1e-16 relative); the float
/// clip coefficient is then the same bit for bit unless that rounding straddles a float
/// boundary. Padding is zero and left out, so each element counts once. Chapters 06-08.
inline double clip_sharded_grad_norm(Communicator& comm,
                                     const std::vector<std::span<float>>& shards, float max_norm) {
  std::vector<double> sums(static_cast<size_t>(comm.world_size()), 0.0);  // (N) each rank's Σ g²
  for (std::span<float> shard : shards) sums[comm.rank()] += sum_of_squares(shard);
  const double norm = sum_in_rank_order(comm, sums);
  const float coef = clip_coefficient(norm, max_norm);
  if (coef < 1.0f)
    for (std::span<float> shard : shards) scale_in_place(shard, coef);
  return norm;
}

}  // namespace ringzero
