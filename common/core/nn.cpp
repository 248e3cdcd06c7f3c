#include "common/core/nn.hpp"

#include <algorithm>
#include <cmath>

#include "common/core/check.hpp"
#include "common/core/ops.hpp"
#include "common/core/rng.hpp"

namespace ringzero {

Var Module::operator()(Tape& tape, const Var& inp) {
  for (auto& h : pre_forward_) h.run(*this);
  // Recorded first, so replayed last: after this module's backward ops.
  if (!post_backward_.empty())
    tape.record([this] {
      for (auto& h : post_backward_) h.run(*this);
    });
  Var out = forward(tape, inp);
  // Recorded last, so replayed first: before this module's backward ops.
  if (!pre_backward_.empty())
    tape.record([this] {
      for (auto& h : pre_backward_) h.run(*this);
    });
  for (auto& h : post_forward_) h.run(*this);
  return out;
}

void Module::remove_hook(uint64_t id) {
  for (auto* hooks : {&pre_forward_, &post_forward_, &pre_backward_, &post_backward_})
    std::erase_if(*hooks, [id](const Added& h) { return h.id == id; });
}

Linear::Linear(const std::string& name, int64_t in_features, int64_t out_features)
    : Module(name),
      weight(name + ".weight", {out_features, in_features}),
      bias(name + ".bias", {out_features}) {}

Var Linear::forward(Tape& tape, const Var& inp) {
  if (compute_dtype != Dtype::fp32) return linear_half(tape, inp, weight, bias, compute_dtype);
  return linear(tape, inp, weight, bias);
}

Var ReLU::forward(Tape& tape, const Var& inp) {
  return relu(tape, inp);
}

std::vector<Parameter*> Sequential::parameters() {
  std::vector<Parameter*> out;
  for (auto& layer : layers) {
    auto p = layer->parameters();
    out.insert(out.end(), p.begin(), p.end());
  }
  return out;
}

Var Sequential::forward(Tape& tape, const Var& inp) {
  Var x = inp;
  for (auto& layer : layers) x = (*layer)(tape, x);
  return x;
}

Model::Model(const std::vector<int64_t>& sizes, uint64_t seed) {
  RZ_CHECK(sizes.size() >= 2, "a model needs at least an input and an output size");
  for (int64_t s : sizes) RZ_CHECK(s > 0, "layer size " << s << " must be positive");
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    if (i > 0) net.add(std::make_unique<ReLU>(std::to_string(net.layers.size())));
    net.add(std::make_unique<Linear>(std::to_string(net.layers.size()), sizes[i], sizes[i + 1]));
  }
  params_ = net.parameters();
  int64_t total = 0;
  for (Parameter* p : params_) {
    offsets_.push_back(total);
    total += p->numel();
  }
  num_parameters_ = total;
  params_memory = Buffer(total, MemTag::parameters);
  grads_memory = Buffer(total, MemTag::gradients);
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i]->data = Tensor(params_memory.data() + offsets_[i], params_[i]->shape());
    params_[i]->grad = Tensor(grads_memory.data() + offsets_[i], params_[i]->shape());
  }
  // One RNG stream per parameter: a parameter's initial values do not depend on the others.
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = *params_[i];
    const int64_t fan_in = p.shape().size() == 2 ? p.shape()[1] : params_[i - 1]->shape()[1];
    const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
    Rng rng(seed, 1000 + i);
    for (float& v : p.data.span()) v = rng.uniform(-bound, bound);
  }
}

std::vector<Linear*> Model::linear_layers() const {
  std::vector<Linear*> out;
  for (auto& layer : net.layers)
    if (auto* l = dynamic_cast<Linear*>(layer.get())) out.push_back(l);
  return out;
}

int Model::parameter_index(const Parameter& p) const {
  const auto it = std::find(params_.begin(), params_.end(), &p);
  RZ_CHECK(it != params_.end(), p.name() << " is not a parameter of this model");
  return static_cast<int>(it - params_.begin());
}

std::vector<int> Model::parameter_indices(Module& module) const {
  std::vector<int> indices;
  for (Parameter* p : module.parameters()) indices.push_back(parameter_index(*p));
  return indices;
}

void Model::zero_grad() {
  zero_memory(grads_memory.data(), grads_memory.bytes());  // all-zero bits: 0.0f, here or there
}

void Model::to(Device device) {
  // Both arrays exist on `device` before either old one goes, so a failed allocation (out of
  // device memory) leaves the model as it was.
  Buffer params(params_memory.size(), params_memory.tag(), device);
  Buffer grads(grads_memory.size(), grads_memory.tag(), device);
  copy_memory(params.data(), params_memory.data(), params_memory.bytes());
  copy_memory(grads.data(), grads_memory.data(), grads_memory.bytes());
  params_memory = std::move(params);
  grads_memory = std::move(grads);
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i]->data = Tensor(params_memory.data() + offsets_[i], params_[i]->shape());
    params_[i]->grad = Tensor(grads_memory.data() + offsets_[i], params_[i]->shape());
  }
  device_ = device;
}

}  // namespace ringzero
