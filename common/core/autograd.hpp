// autograd: a reverse-mode tape over Tensors, with the hooks distributed training needs.
//
// Provides: Node/Var (a value and its gradient), Parameter (named, with CURRENT storage for
// data and grad, and gradient-ready hooks), and Tape (records each op's backward as it runs
// forward; backward() replays them in reverse).
//
// Three invariants later chapters rely on:
//  1. Backward ACCUMULATES (+=) into gradients, so running two micro-batches before the
//     optimizer step sums their gradients (chapter 02) with no extra code.
//  2. Gradient-ready: each parameter's hooks fire exactly once per backward, right after the
//     last op that uses it has accumulated into it (chapter 05's buckets, chapter 07's early
//     reduce-scatter). This is PyTorch's AccumulateGrad post-hook, in miniature.
//  3. Ops read Parameter::data and Parameter::grad when they run, forward and backward,
//     never a copy taken at record time, so chapter 08 can free a layer's weights after its
//     forward and gather them again (maybe at another address) before its backward.
// Leaves out: higher-order gradients, in-place ops, graph pruning, retain_graph.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/core/tensor.hpp"

namespace ringzero {

/// A value in the graph (an activation or a loss) and its gradient.
struct Node {
  Tensor value;
  Tensor grad;                 // same shape as value; allocated (zeroed) on first use
  bool requires_grad = false;  // false for inputs: their gradient is never computed
  /// The gradient buffer, allocated as zeros (tag activations) on first call.
  Tensor& grad_buffer();
};
using Var = std::shared_ptr<Node>;
Var make_var(Tensor value, bool requires_grad = false);

/// A trainable tensor. `data` and `grad` are views the owner may re-point at any time
/// between ops (flat buffers, buckets, gathered ZeRO-3 storage).
class Parameter {
 public:
  using Hook = std::function<void(Parameter&)>;
  Parameter(std::string name, Shape shape) : name_(std::move(name)), shape_(std::move(shape)) {}

  const std::string& name() const { return name_; }
  const Shape& shape() const { return shape_; }
  int64_t numel() const { return ringzero::numel(shape_); }

  Tensor data;  ///< current storage, shape()
  Tensor grad;  ///< current gradient storage, shape(); backward does +=

  /// Called once per backward when this parameter's gradient is final for that backward.
  void add_grad_ready_hook(Hook hook) { hooks_.push_back(std::move(hook)); }
  void clear_grad_ready_hooks() { hooks_.clear(); }

 private:
  friend class Tape;
  std::string name_;
  Shape shape_;
  std::vector<Hook> hooks_;
  int pending_uses_ = 0;  // ops recorded in this forward whose backward has not run yet
};

/// The list of backward closures recorded during one forward.
class Tape {
 public:
  Tape() = default;
  /// Releases the pending uses of whatever was recorded but never replayed (see clear()).
  ~Tape() { clear(); }
  Tape(const Tape&) = delete;
  Tape& operator=(const Tape&) = delete;

  /// Records `backward`, which must accumulate into the gradients of its inputs and of
  /// `params`. Each listed parameter counts one pending use until that backward runs.
  void record(std::function<void()> backward, std::vector<Parameter*> params = {});

  /// Runs every recorded backward in reverse order, seeding d(loss) = seed (so
  /// backward(loss, s) equals PyTorch's (s * loss).backward()), firing gradient-ready hooks
  /// as parameters complete, then clears the tape (activations are freed as it goes).
  /// Errors: loss must be a scalar that requires grad.
  void backward(const Var& loss, float seed = 1.0f);

  size_t size() const { return entries_.size(); }
  /// Drops the recorded ops without running them, releasing their parameters' pending uses:
  /// a forward that is never backpropagated (evaluation) must not hold back the
  /// gradient-ready hooks of the next backward. Fires no hook.
  void clear();

 private:
  struct Entry {
    std::function<void()> backward;
    std::vector<Parameter*> params;
  };
  std::vector<Entry> entries_;
};

}  // namespace ringzero
