// Unused layers: a layer whose backward ran in no micro-step of a step is ZeRO-3's unused
// parameter, and means what one means in chapters 05-07 (chapter 05's readiness.hpp, "Unused
// parameters"; PyTorch's find_unused_parameters). Its gradient shard got nothing, so the
// optimizer would step it with a zero gradient without saying so: by default every rank fails,
// naming its parameters, with DDP's message; with find_unused_parameters the zero gradient is
// what the user asked for. Every rank sees the same layers run (the desync check, desync.hpp,
// makes sure), so every rank decides alike. Zero3 marks each layer in its post-backward hook and
// checks after the step's last backward (Zero3::finalize_backward).
// Leaves out: which micro-step a layer skipped (one run in any micro-step of the step counts).
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "chapters/08_zero3/layer_shard.hpp"
#include "common/core/check.hpp"

namespace ringzero {

/// Which layers of a LayerLayout ran their backward in this step.
class UnusedLayers {
 public:
  explicit UnusedLayers(size_t num_layers = 0) : ran_backward_(num_layers, 0) {}

  /// Layer l's backward ran (its post-backward hook).
  void ran_backward(int l) { ran_backward_[l] = 1; }

  /// After the step's last backward: forgets the marks (the next step starts anew) and, unless
  /// find_unused_parameters, fails naming the parameters of every layer of `layout` whose
  /// backward did not run ("parameters that received no gradient in this backward: 2.weight,
  /// 2.bias. ..."), as chapter 05's DDP::finalize_backward.
  void check(const LayerLayout& layout, bool find_unused_parameters) {
    std::string unused;
    for (size_t l = 0; l < ran_backward_.size(); ++l)
      if (!ran_backward_[l])
        for (Parameter* p : layout.layers[l]->parameters())
          unused += (unused.empty() ? "" : ", ") + p->name();
    std::fill(ran_backward_.begin(), ran_backward_.end(), 0);
    RZ_CHECK(unused.empty() || find_unused_parameters,
             "parameters that received no gradient in this backward: "
                 << unused
                 << ". Every rank would step them with a zero gradient without saying so. Make "
                    "every parameter take part in the loss, or pass --find-unused-parameters "
                    "(PyTorch: find_unused_parameters=True) to count a missing gradient as zero");
  }

 private:
  std::vector<char> ran_backward_;  // (layers) 1 once its backward ran in this step
};

}  // namespace ringzero
