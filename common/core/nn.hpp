// nn: modules with named parameters, and the model with flat parameter/gradient buffers.
//
// Provides: Module (forward with pre/post forward and pre/post backward hooks, removable;
// ModuleHooks removes an owner's hooks with it), Linear (PyTorch's default initialisation),
// ReLU, Sequential, and Model: a Sequential whose parameters and gradients are views into ONE
// flat buffer each (llm.c's params_memory / grads_memory), in registration order. Bucketing
// (chapter 05) and sharding (06-08) are then just (offset, size) ranges of those buffers. Names
// follow PyTorch's state_dict() for nn.Sequential: "0.weight", "0.bias", "2.weight", ... Leaves
// out: nested submodule trees beyond one Sequential, buffers (BatchNorm stats), dtypes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/core/autograd.hpp"
#include "common/core/half.hpp"

namespace ringzero {

class Module {
 public:
  using Hook = std::function<void(Module&)>;
  explicit Module(std::string name) : name_(std::move(name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  /// Runs pre-forward hooks, forward, post-forward hooks. On the tape it brackets the
  /// forward's ops so that, in backward, pre-backward hooks run before this module's
  /// backward ops and post-backward hooks right after them (what ZeRO-3 gathers/frees on).
  Var operator()(Tape& tape, const Var& inp);

  const std::string& name() const { return name_; }
  /// This module's own parameters (none for ReLU), in registration order.
  virtual std::vector<Parameter*> parameters() { return {}; }

  /// Each returns the hook's id, for remove_hook (PyTorch's RemovableHandle). Post hooks:
  /// first = true runs `h` before the hooks added so far (a timer that brackets the compute
  /// only, trace_layers), else after them.
  uint64_t add_pre_forward_hook(Hook h) { return add(pre_forward_, std::move(h), false); }
  uint64_t add_post_forward_hook(Hook h, bool first = false) {
    return add(post_forward_, std::move(h), first);
  }
  uint64_t add_pre_backward_hook(Hook h) { return add(pre_backward_, std::move(h), false); }
  uint64_t add_post_backward_hook(Hook h, bool first = false) {
    return add(post_backward_, std::move(h), first);
  }
  /// Removes the hook with id `id` (not during a call of this module's hooks); an unknown id
  /// does nothing.
  void remove_hook(uint64_t id);

 protected:
  virtual Var forward(Tape& tape, const Var& inp) = 0;

 private:
  struct Added {
    uint64_t id;
    Hook run;
  };
  uint64_t add(std::vector<Added>& hooks, Hook h, bool first) {
    hooks.insert(first ? hooks.begin() : hooks.end(), Added{++last_id_, std::move(h)});
    return last_id_;
  }
  std::string name_;
  std::vector<Added> pre_forward_, post_forward_, pre_backward_, post_backward_;
  uint64_t last_id_ = 0;
};

/// The hooks one owner (an engine) adds to modules, removed from them when it is destroyed
/// (PyTorch's RemovableHandle.remove() for each): the hooks leave the model with their owner
/// instead of calling into a destroyed object. The modules must outlive it.
class ModuleHooks {
 public:
  ModuleHooks() = default;
  ModuleHooks(const ModuleHooks&) = delete;
  ModuleHooks& operator=(const ModuleHooks&) = delete;
  ~ModuleHooks() {
    for (auto& [module, id] : added_) module->remove_hook(id);
  }
  void pre_forward(Module& m, Module::Hook h) { keep(m, m.add_pre_forward_hook(std::move(h))); }
  void post_forward(Module& m, Module::Hook h) { keep(m, m.add_post_forward_hook(std::move(h))); }
  void pre_backward(Module& m, Module::Hook h) { keep(m, m.add_pre_backward_hook(std::move(h))); }
  void post_backward(Module& m, Module::Hook h) { keep(m, m.add_post_backward_hook(std::move(h))); }

 private:
  void keep(Module& m, uint64_t id) { added_.emplace_back(&m, id); }
  std::vector<std::pair<Module*, uint64_t>> added_;
};

/// y = x Wᵀ + b, W (out, in), b (out). Init (PyTorch nn.Linear.reset_parameters): W and b
/// uniform in ±1/sqrt(in) (kaiming_uniform with a = sqrt(5) reduces to exactly that bound).
class Linear : public Module {
 public:
  Linear(const std::string& name, int64_t in_features, int64_t out_features);
  std::vector<Parameter*> parameters() override { return {&weight, &bias}; }
  Parameter weight, bias;
  /// fp32: linear(); bf16/fp16: linear_half() (set by HalfStorage, common/precision/mixed.hpp).
  Dtype compute_dtype = Dtype::fp32;

 protected:
  Var forward(Tape& tape, const Var& inp) override;
};

class ReLU : public Module {
 public:
  using Module::Module;

 protected:
  Var forward(Tape& tape, const Var& inp) override;
};

/// Layers named "0", "1", ... as nn.Sequential names them.
class Sequential : public Module {
 public:
  Sequential() : Module("") {}
  void add(std::unique_ptr<Module> layer) { layers.push_back(std::move(layer)); }
  std::vector<Parameter*> parameters() override;
  std::vector<std::unique_ptr<Module>> layers;

 protected:
  Var forward(Tape& tape, const Var& inp) override;
};

/// A Sequential MLP whose parameters and gradients live in two flat buffers.
class Model {
 public:
  /// sizes = {in, h1, ..., out}: Linear(in, h1), ReLU, ..., Linear(h_last, out).
  /// Parameters are initialised from `seed` alone, so every rank and every world size starts
  /// from the same weights. Errors: fewer than two sizes, a non-positive size.
  Model(const std::vector<int64_t>& sizes, uint64_t seed);

  Var forward(Tape& tape, const Var& inp) { return net(tape, inp); }
  /// Parameters in registration order (0.weight, 0.bias, 2.weight, ...).
  const std::vector<Parameter*>& parameters() const { return params_; }
  /// Element offset of parameters()[i] in the flat buffers.
  const std::vector<int64_t>& offsets() const { return offsets_; }
  /// Ψ, the number of parameter elements (fixed at construction: still Ψ after a ZeRO
  /// chapter releases params_memory).
  int64_t num_parameters() const { return num_parameters_; }
  /// The Linear layers, in order (what ZeRO-3 hooks, what traces name).
  std::vector<Linear*> linear_layers() const;
  /// The index of `p` in parameters(). Errors: a parameter that is not this model's.
  int parameter_index(const Parameter& p) const;
  /// parameter_index of each of `module`'s parameters (a layer's weight and bias).
  std::vector<int> parameter_indices(Module& module) const;
  /// Sets every gradient to zero (PyTorch zero_grad(set_to_none=False)).
  void zero_grad();
  /// Moves the parameters and gradients to `device` (PyTorch's Module.to): both flat buffers
  /// move and every Parameter's views are re-pointed into them; the ops then run there.
  void to(Device device);
  /// Where the parameters live (cpu until to()).
  Device device() const { return device_; }

  Sequential net;
  Buffer params_memory;  ///< (Ψ) all parameters, registration order; tag parameters
  Buffer grads_memory;   ///< (Ψ) all gradients, same layout; tag gradients

 private:
  std::vector<Parameter*> params_;
  std::vector<int64_t> offsets_;
  int64_t num_parameters_ = 0;
  Device device_ = Device::cpu;
};

}  // namespace ringzero
