// finite_check: where a non-finite loss starts, in a distributed run (issue 9, item 6).
//
// Provides: check_finite_loss for chapters 03-08. Every rank holds the same global-batch loss
// (all-reduced), so every rank sees a NaN at the same step and all stop together; this names
// also the rank(s) whose own micro-batches produced it, which the global mean hides.
// Costs nothing while the loss is finite (the extra gather runs only on the failing step).
// Leaves out: per-parameter gradient scans (a non-finite gradient makes the next loss
// non-finite, which this reports one step later).
#pragma once

#include <cstdint>

#include "comm.hpp"

namespace ringzero {

/// Collective only when global_loss is not finite (then on every rank, since every rank holds
/// the same global_loss). Errors: "loss is nan at step S (global-batch mean); non-finite on
/// rank(s) 1 (local loss nan), finite on the others" and the usual fixes, on every rank.
void check_finite_loss(Communicator& comm, double local_loss, double global_loss, int64_t step);

}  // namespace ringzero
