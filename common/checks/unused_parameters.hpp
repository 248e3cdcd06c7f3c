// unused_parameters: what a data-parallel engine does about parameters that received no gradient
// in a backward (a layer the forward skipped; PyTorch DDP's find_unused_parameters), written once
// for DDP's buckets (chapter 05's readiness.hpp, and so chapters 06-07) and ZeRO-3's layers
// (chapter 08's zero3.hpp). Every rank runs the same backward, so every rank decides alike.
// Leaves out: how an engine learns which gradients arrived (its hooks) and what it does first.
#pragma once

#include <string>
#include <vector>

#include "common/core/check.hpp"
#include "common/core/nn.hpp"

namespace ringzero {

/// The names of the parameters whose flag in `received` (one per parameter of `params`, same
/// order) is 0, ", "-separated in that order: "2.weight, 2.bias"; "" when every one is set.
inline std::string unused_parameter_names(const std::vector<Parameter*>& params,
                                          const std::vector<char>& received) {
  std::string names;
  for (size_t i = 0; i < params.size(); ++i)
    if (!received[i]) names += (names.empty() ? "" : ", ") + params[i]->name();
  return names;
}

/// Fails unless `unused` (unused_parameter_names) is empty or find_unused_parameters is set:
/// "parameters that received no gradient in this backward: <unused>. <consequence>. Make every
/// parameter take part in the loss, or pass --find-unused-parameters (PyTorch:
/// find_unused_parameters=True) to count a missing gradient as zero". consequence: what the
/// engine would do with them, one sentence without its full stop.
inline void check_unused_parameters(const std::string& unused, bool find_unused_parameters,
                                    const std::string& consequence) {
  RZ_CHECK(unused.empty() || find_unused_parameters,
           "parameters that received no gradient in this backward: "
               << unused << ". " << consequence
               << ". Make every parameter take part in the loss, or pass --find-unused-parameters "
                  "(PyTorch: find_unused_parameters=True) to count a missing gradient as zero");
}

}  // namespace ringzero
