#include "common/precision/mixed.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/core/check.hpp"
#include "common/core/kernels.hpp"
#include "common/core/ops.hpp"

namespace ringzero {

namespace {

// dst16[i] = to_16(to_32(dst16[i]) + to_32(to_16(src[i]))): the fp32 gradient is first rounded
// to 16 bits (the dtype of a 16-bit op's output), then accumulated in 16 bits.
void accumulate_rounded(Dtype dtype, std::span<uint16_t> dst16, std::span<const float> src) {
  for_each_block<uint16_t>(
      std::ssize(src), device_of(dst16.data()), [&](size_t i, std::span<uint16_t> t) {
        convert_to_half(dtype, src.subspan(i, t.size()), t);
        accumulate_half(dtype, dst16.subspan(i, t.size()), std::span<const uint16_t>(t));
      });
}

}  // namespace

HalfStorage::HalfStorage(Model& model, Dtype dtype) : model_(model), dtype_(dtype) {
  RZ_CHECK(dtype != Dtype::fp32, "HalfStorage: dtype fp32 needs no 16-bit storage");
  const int64_t psi = model.num_parameters();
  RZ_CHECK(model.params_memory.size() == psi && model.grads_memory.size() == psi,
           "HalfStorage: the model's flat buffers are already released (ZeRO?)");
  params16 = Buffer16(psi, MemTag::parameters, model.device());
  grads16 = Buffer16(psi, MemTag::gradients, model.device());
  convert_to_half(dtype, model.params_memory.span(), params16.span());
  const auto& params = model.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const auto at = static_cast<size_t>(model.offsets()[i]);
    const auto n = static_cast<size_t>(params[i]->numel());
    param16_of_.push_back(params16.span().subspan(at, n));
    grad16_of_.push_back(grads16.span().subspan(at, n));
  }
  hook_layers();
}

HalfStorage::HalfStorage(Model& model, Dtype dtype, std::span<uint16_t> external_params16,
                         const std::vector<int64_t>& param_offsets)
    : model_(model), dtype_(dtype) {
  RZ_CHECK(dtype != Dtype::fp32, "HalfStorage: dtype fp32 needs no 16-bit storage");
  const int64_t psi = model.num_parameters();
  RZ_CHECK(model.params_memory.size() == psi && model.grads_memory.size() == psi,
           "HalfStorage: the model's flat buffers are already released");
  const auto& params = model.parameters();
  RZ_CHECK(
      param_offsets.size() == params.size(),
      "HalfStorage: " << param_offsets.size() << " offsets for " << params.size() << " parameters");
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t at = param_offsets[i], n = params[i]->numel();
    RZ_CHECK(at >= 0 && at + n <= static_cast<int64_t>(external_params16.size()),
             "HalfStorage: " << params[i]->name() << " at [" << at << ", " << at + n
                             << ") lies outside the " << external_params16.size()
                             << "-element 16-bit buffer");
    param16_of_.push_back(
        external_params16.subspan(static_cast<size_t>(at), static_cast<size_t>(n)));
    convert_to_half(dtype, params[i]->data.span(), param16_of_.back());
  }
  grad16_of_.resize(params.size());
  hook_layers();
}

void HalfStorage::set_grad16(size_t param, std::span<uint16_t> grad16) {
  const Parameter& p = *model_.parameters().at(param);
  RZ_CHECK(grad16.empty() || static_cast<int64_t>(grad16.size()) == p.numel(),
           "HalfStorage::set_grad16: " << grad16.size() << " elements for " << p.name() << " ("
                                       << p.numel() << ")");
  grad16_of_.at(param) = grad16;
}

void HalfStorage::hook_layers() {
  Model& model = model_;
  const std::vector<Linear*> layers = model.linear_layers();
  int64_t largest = 0;
  for (Linear* l : layers) largest = std::max(largest, l->weight.numel() + l->bias.numel());
  work_ = Buffer(largest, MemTag::activations, model.device());
  grad_scratch_ = Buffer(largest, MemTag::activations, model.device());
  model.params_memory.release();
  model.grads_memory.release();

  for (size_t l = 0; l < layers.size(); ++l) {
    Linear& layer = *layers[l];
    layer.compute_dtype = dtype_;
    hooks_.pre_forward(layer, [this, l](Module&) { load_layer(l); });
    hooks_.pre_backward(layer, [this, l](Module& m) {
      load_layer(l);
      auto& lin = static_cast<Linear&>(m);
      zero_elements(
          grad_scratch_.span().first(static_cast<size_t>(lin.weight.numel() + lin.bias.numel())));
    });
    for (Parameter* p : {&layer.weight, &layer.bias}) {
      const auto i = static_cast<size_t>(model.parameter_index(*p));
      p->add_grad_ready_hook([this, i](Parameter& q) {
        RZ_CHECK(!grad16_of_[i].empty(), "HalfStorage: " << q.name()
                                                         << " received a gradient but has no "
                                                            "16-bit gradient storage (set_grad16)");
        accumulate_rounded(dtype_, grad16_of_[i], q.grad.span());
      });
    }
  }
  if (!layers.empty()) load_layer(0);
}

void HalfStorage::load_layer(size_t l) {
  Linear& layer = *model_.linear_layers()[l];
  int64_t at = 0;
  for (Parameter* p : {&layer.weight, &layer.bias}) {
    const auto i = static_cast<size_t>(model_.parameter_index(*p));
    const auto n = static_cast<size_t>(p->numel());
    convert_to_float(dtype_, param16_of_[i], work_.span().subspan(static_cast<size_t>(at), n));
    p->data = Tensor(work_.data() + at, p->shape());
    p->grad = Tensor(grad_scratch_.data() + at, p->shape());
    at += p->numel();
  }
}

void HalfStorage::zero_grad() {
  zero_elements(grads16.span());
}

std::vector<float> HalfStorage::params_as_float() const {
  std::vector<float> out(static_cast<size_t>(params16.size()));
  convert_to_float(dtype_, params16.span(), out);
  return out;
}

MasterWeights::MasterWeights(Dtype dtype, std::span<const float> initial,
                             std::vector<int64_t> segment_sizes, AdamWOptions options)
    : dtype_(dtype), sizes_(std::move(segment_sizes)), steps_(sizes_.size(), 0), options_(options) {
  RZ_CHECK(dtype != Dtype::fp32, "MasterWeights: dtype fp32 trains the parameters directly");
  const int64_t total = std::accumulate(sizes_.begin(), sizes_.end(), int64_t{0});
  RZ_CHECK(total == static_cast<int64_t>(initial.size()),
           "MasterWeights: segments sum to " << total << ", " << initial.size() << " values");
  AdamW check({}, options);  // AdamW's option checks and messages; allocates nothing
  const Device device = device_of(initial.data());  // where the state lives: the initial's place
  master_ = Buffer(total, MemTag::optimizer_state, device);
  exp_avg_ = Buffer(total, MemTag::optimizer_state, device);
  exp_avg_sq_ = Buffer(total, MemTag::optimizer_state, device);
  copy_elements(initial, master_.span());
}

template <class Load>
void MasterWeights::step_with(std::span<uint16_t> params16, int64_t n_grads, float grad_factor,
                              Load load) {
  RZ_CHECK(static_cast<int64_t>(params16.size()) == n_grads && n_grads == master_.size(),
           "MasterWeights::step: " << params16.size() << " params, " << n_grads
                                   << " grads, state for " << master_.size());
  // Blocks of fp32 gradients (for_each_block: on the stack on the host, a Scratch on a device),
  // element by element, so the same bits either way.
  int64_t begin = 0;
  for (size_t s = 0; s < sizes_.size(); ++s) {
    const int64_t t = ++steps_[s];
    // AdamW::step's constants and its one element formula (kernels.hpp), on the fp32 master:
    // the same bits as fp32 training's update of the same gradient.
    const kernels::AdamWStep k = adamw_step_constants(options_, t);
    for_each_block<float>(sizes_[s], master_.device(), [&](size_t i, std::span<float> g) {
      const size_t at = static_cast<size_t>(begin) + i;
      load(at, g);
      if (grad_factor != 1.0f) scale_in_place(g, grad_factor);
      adamw_update(master_.data() + at, exp_avg_.data() + at, exp_avg_sq_.data() + at, g.data(),
                   std::ssize(g), k);  // common/core/optim.hpp: host or device
      convert_to_half(dtype_, master_.span().subspan(at, g.size()), params16.subspan(at, g.size()));
    });
    begin += sizes_[s];
  }
}

void MasterWeights::step(std::span<uint16_t> params16, std::span<const uint16_t> grads16,
                         float grad_factor) {
  step_with(params16, static_cast<int64_t>(grads16.size()), grad_factor,
            [&](size_t b, std::span<float> g) {
              convert_to_float(dtype_, grads16.subspan(b, g.size()), g);
            });
}

void MasterWeights::step(std::span<uint16_t> params16, std::span<const float> grads32,
                         float grad_factor) {
  step_with(params16, static_cast<int64_t>(grads32.size()), grad_factor,
            [&](size_t b, std::span<float> g) { copy_elements(grads32.subspan(b, g.size()), g); });
}

AdamWOptions adamw_options(const TrainConfig& config) {
  AdamWOptions o;
  o.lr = config.lr;
  o.weight_decay = config.weight_decay;
  return o;
}

}  // namespace ringzero
