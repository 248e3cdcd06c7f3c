// finite_check: where a non-finite loss or gradient starts, in a distributed run (issue 9,
// item 6).
//
// Provides: check_finite_loss for chapters 03-08. Every rank holds the same global-batch loss
// (all-reduced), so every rank sees a NaN at the same step and all stop together; this names
// also the rank(s) whose own micro-batches produced it, which the global mean hides.
// And the gradient scan (gradient_scan_extension, a Run extension every chapter has): a
// gradient-ready hook on every parameter, registered before the lesson's own (so it reads each
// rank's LOCAL gradient, before DDP or ZeRO reduces it), records the first step, parameter and
// element where this rank's gradient is not finite. A non-finite local gradient becomes the
// global one (the reduction sums it into every rank's), then non-finite weights, then a
// non-finite loss one step later on every rank: check_finite_loss then names the step and the
// rank(s) where the gradient first went bad. If the run ends first, the end-of-run report
// stops every rank with the same message, before --save-final writes non-finite weights.
// Cost: the loss check, nothing while the loss is finite (the extra gather runs only on the
// failing step); the scan, one pass over each rank's gradient per micro-step (reads Ψ floats;
// measured in docs/benchmarks.md).
// Leaves out: which op produced the value (PyTorch's torch.autograd.detect_anomaly), non-finite
// activations whose gradient stays finite.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/comm/comm.hpp"

namespace ringzero {

class Extension;

/// Collective only when global_loss is not finite (then on every rank, since every rank holds
/// the same global_loss). Errors: "loss is nan at step S (global-batch mean); non-finite on
/// rank(s) 1 (local loss nan), finite on the others" and, when the gradient scan found one,
/// "the gradient first became non-finite at step S' on rank(s) 1 (net.0.weight[12] = inf)",
/// and the usual fixes, on every rank.
void check_finite_loss(Communicator& comm, double local_loss, double global_loss, int64_t step);

/// This rank's first non-finite gradient element seen by the scan: "" if none, else
/// "step S: net.0.weight[12] = inf" (for messages and tests).
std::string first_nonfinite_gradient();

/// The gradient scan (see the top of this file); common/driver/run.cpp registers it.
std::unique_ptr<Extension> gradient_scan_extension();

}  // namespace ringzero
