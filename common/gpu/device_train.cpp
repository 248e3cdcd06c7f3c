// DeviceTrainer on CUDA: the layer loop of Model::forward and Tape::backward, written out over
// device buffers. See common/device_train.hpp.
#include <cmath>
#include <utility>
#include <vector>

#include "common/check.hpp"
#include "common/device_train.hpp"
#include "common/gpu/device.hpp"
#include "common/optim.hpp"

namespace ringzero {

namespace {

class CudaTrainer final : public DeviceTrainer {
 public:
  CudaTrainer(const Model& model, const TrainConfig& config, int device,
              DeviceTrainerOptions options)
      : config_(config), sizes_(config.layer_sizes()), segments_(parameter_sizes(model)) {
    name_ = require_gpu(device);
    const int64_t psi = model.num_parameters();
    offsets_ = options.offsets.empty() ? model.offsets() : options.offsets;
    flat_size_ = options.flat_size < 0 ? psi : options.flat_size;
    RZ_CHECK(offsets_.size() == 2 * (sizes_.size() - 1),
             "the device path needs a Linear/ReLU MLP: " << offsets_.size() << " parameters for "
                                                         << sizes_.size() - 1 << " layers");
    if (options.flat_params) {
      params_ = DeviceBuffer(flat_size_, MemTag::parameters);
      // each parameter at its place in the (possibly padded) flat layout; padding stays zero
      for (size_t p = 0; p < offsets_.size(); ++p) {
        const Parameter& param = *model.parameters()[p];
        RZ_CHECK(param.data.numel() == param.numel(),
                 "the device path needs the whole parameter " << param.name() << " on the host");
        params_.copy_from_host(param.data.data(), param.numel(), offsets_[p]);
      }
    }
    if (options.flat_grads) grads_ = DeviceBuffer(flat_size_, MemTag::gradients);
    if (!options.optimizer) return;
    RZ_CHECK(options.flat_params && options.flat_grads && flat_size_ == psi,
             "the device trainer's own optimizer needs the flat unpadded buffers");
    if (config.optimizer == "adamw") {
      adamw_ = AdamWOptions{.lr = config.lr, .weight_decay = config.weight_decay};
      exp_avg_ = DeviceBuffer(psi, MemTag::optimizer_state);
      exp_avg_sq_ = DeviceBuffer(psi, MemTag::optimizer_state);
      steps_.assign(segments_.size(), 0);
    } else if (config.momentum > 0) {
      momentum_buffer_ = DeviceBuffer(psi, MemTag::optimizer_state);
    }
  }

  ~CudaTrainer() override {
    device_free(labels_, labels_capacity_ * 4, MemTag::activations);
    device_free(row_nll_, labels_capacity_ * 8, MemTag::activations);
  }

  void zero_grad() override { grads_.zero(); }

  float* params() override { return params_.data(); }
  float* grads() override { return grads_.data(); }
  int64_t flat_size() const override { return flat_size_; }

  double forward_backward(const Batch& batch, float dloss, DeviceLayerHooks* hooks) override {
    const int64_t B = batch.x.rows(), L = static_cast<int64_t>(sizes_.size()) - 1;
    allocate(B);
    acts_[0].copy_from_host(batch.x.data(), B * sizes_[0]);
    // Layer l's weight and bias: the hooks' (ZeRO-3's gathered layer) or the flat buffer's.
    auto layer_params = [&](int64_t l, bool backward, const float*& w, const float*& b) {
      const float* p = hooks ? hooks->layer_params(l, backward) : nullptr;
      w = p ? p : weight(l);
      b = p ? p + sizes_[l] * sizes_[l + 1] : bias(l);
      RZ_CHECK(w != nullptr, "layer " << l << ": no parameters on the device");
    };
    // forward: pre[l] = acts[l] W_lᵀ + b_l; acts[l + 1] = relu(pre[l]) except after the last
    for (int64_t l = 0; l < L; ++l) {
      const float *w = nullptr, *b = nullptr;
      layer_params(l, false, w, b);
      gpu::linear_forward(pre_[l].data(), acts_[l].data(), w, b, B, sizes_[l], sizes_[l + 1]);
      if (l + 1 < L) gpu::relu_forward(acts_[l + 1].data(), pre_[l].data(), B * sizes_[l + 1]);
      if (hooks) hooks->after_layer_forward(l);
    }
    // loss and its gradient into dpre[L - 1] (zeroed: backward accumulates, as on the CPU)
    for (auto& d : dpre_) d.zero();
    for (auto& d : dacts_) d.zero();
    const int64_t C = sizes_.back();
    float loss = 0.0f;
    if (config_.classification()) {
      RZ_CHECK(static_cast<int64_t>(batch.labels.size()) == B,
               "cross_entropy: " << batch.labels.size() << " labels for " << B << " rows");
      for (int32_t y : batch.labels)
        RZ_CHECK(y >= 0 && y < C, "cross_entropy: label " << y << " outside [0, " << C << ")");
      copy_to_device(labels_, batch.labels.data(), B * 4);
      gpu::cross_entropy_forward(probs_.data(), row_nll_, pre_[L - 1].data(), labels_, B, C);
      std::vector<double> nll(static_cast<size_t>(B));
      ringzero::copy_to_host(nll.data(), row_nll_, B * 8);
      double sum = 0.0;  // in row order, as cross_entropy_forward on the CPU
      for (double x : nll) sum += x;
      loss = static_cast<float>(sum / static_cast<double>(B));
      gpu::cross_entropy_backward(dpre_[L - 1].data(), probs_.data(), labels_, B, C,
                                  dloss / static_cast<float>(B));
    } else {
      target_.copy_from_host(batch.y.data(), B * C);
      const double sum = gpu::squared_error_sum(pre_[L - 1].data(), target_.data(), B * C);
      loss = static_cast<float>(sum / static_cast<double>(B * C));
      gpu::mse_backward(dpre_[L - 1].data(), pre_[L - 1].data(), target_.data(), B * C,
                        2.0f * dloss / static_cast<float>(B * C));
    }
    // backward, last layer first
    for (int64_t l = L - 1; l >= 0; --l) {
      float* dinp = l > 0 ? dacts_[l].data() : nullptr;  // no gradient for the input batch
      const float *w = nullptr, *b = nullptr;
      layer_params(l, true, w, b);
      float *dw = grads_.data() ? dweight(l) : nullptr, *db = grads_.data() ? dbias(l) : nullptr;
      if (hooks) hooks->layer_grads(l, dw, db);
      RZ_CHECK(dw != nullptr && db != nullptr, "layer " << l << ": no gradient buffer on the device");
      gpu::linear_backward(dinp, dw, db, dpre_[l].data(), acts_[l].data(), w, B, sizes_[l],
                           sizes_[l + 1]);
      if (l > 0)
        gpu::relu_backward(dpre_[l - 1].data(), dacts_[l].data(), acts_[l].data(), B * sizes_[l]);
      if (hooks) hooks->after_layer_backward(l);
    }
    return loss;
  }

  double clip_grad_norm(float max_norm) override {
    RZ_CHECK(max_norm > 0, "max grad norm = " << max_norm << "; use --clip-grad-norm > 0");
    const double norm = std::sqrt(gpu::sum_of_squares(grads_.data(), grads_.size()));
    const float coef = clip_coefficient(norm, max_norm);
    if (coef < 1.0f) gpu::scale(grads_.data(), grads_.size(), coef);
    return norm;
  }

  void step() override {
    if (config_.optimizer == "adamw") {
      int64_t begin = 0;
      for (size_t s = 0; s < segments_.size(); ++s) {  // a step count per parameter, as torch
        const kernels::AdamWStep k = adamw_step_constants(adamw_, ++steps_[s]);
        gpu::adamw_update(params_.data() + begin, exp_avg_.data() + begin,
                          exp_avg_sq_.data() + begin, grads_.data() + begin, segments_[s], k);
        begin += segments_[s];
      }
    } else {
      gpu::sgd_update(params_.data(), config_.momentum > 0 ? momentum_buffer_.data() : nullptr,
                      grads_.data(), params_.size(), config_.lr, config_.momentum,
                      config_.weight_decay, first_sgd_step_);
      first_sgd_step_ = false;
    }
  }

  void copy_to_host(Model& model) override {
    params_.copy_to_host(model.params_memory.data(), params_.size());
    grads_.copy_to_host(model.grads_memory.data(), grads_.size());
  }

  const std::string& device_name() const override { return name_; }

 private:
  float* weight(int64_t l) { return params_.data() ? params_.data() + offsets_[2 * l] : nullptr; }
  float* bias(int64_t l) { return params_.data() ? params_.data() + offsets_[2 * l + 1] : nullptr; }
  float* dweight(int64_t l) { return grads_.data() + offsets_[2 * l]; }
  float* dbias(int64_t l) { return grads_.data() + offsets_[2 * l + 1]; }

  // Activation buffers for batches of B rows, reallocated only when B changes.
  void allocate(int64_t B) {
    if (B == batch_rows_) return;
    const int64_t L = static_cast<int64_t>(sizes_.size()) - 1;
    acts_.clear();
    dacts_.clear();
    pre_.clear();
    dpre_.clear();
    for (int64_t l = 0; l <= L; ++l) {
      acts_.emplace_back(B * sizes_[l], MemTag::activations);
      dacts_.emplace_back(l > 0 && l < L ? B * sizes_[l] : 0, MemTag::activations);
    }
    for (int64_t l = 0; l < L; ++l) {
      pre_.emplace_back(B * sizes_[l + 1], MemTag::activations);
      dpre_.emplace_back(B * sizes_[l + 1], MemTag::activations);
    }
    probs_ = DeviceBuffer(config_.classification() ? B * sizes_.back() : 0, MemTag::activations);
    target_ = DeviceBuffer(config_.classification() ? 0 : B * sizes_.back(), MemTag::activations);
    device_free(labels_, labels_capacity_ * 4, MemTag::activations);
    device_free(row_nll_, labels_capacity_ * 8, MemTag::activations);
    labels_ = static_cast<int32_t*>(device_alloc(B * 4, MemTag::activations));
    row_nll_ = static_cast<double*>(device_alloc(B * 8, MemTag::activations));
    labels_capacity_ = B;
    batch_rows_ = B;
  }

  TrainConfig config_;
  std::vector<int64_t> sizes_, segments_, offsets_, steps_;
  int64_t flat_size_ = 0;
  std::string name_;
  DeviceBuffer params_, grads_, exp_avg_, exp_avg_sq_, momentum_buffer_;
  AdamWOptions adamw_;
  bool first_sgd_step_ = true;
  std::vector<DeviceBuffer> acts_, dacts_, pre_, dpre_;
  DeviceBuffer probs_, target_;
  int32_t* labels_ = nullptr;
  double* row_nll_ = nullptr;
  int64_t labels_capacity_ = 0, batch_rows_ = -1;
};

}  // namespace

std::unique_ptr<DeviceTrainer> make_device_trainer(const Model& model, const TrainConfig& config,
                                                   int device, DeviceTrainerOptions options) {
  return std::make_unique<CudaTrainer>(model, config, device, std::move(options));
}

}  // namespace ringzero
