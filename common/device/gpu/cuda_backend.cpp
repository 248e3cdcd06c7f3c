// cuda_backend: the device backend on an NVIDIA GPU (--device cuda),
// common/core/device_backend.hpp's table over the kernels of common/device/gpu/kernels.cu (each the
// element function of common/core/kernels.hpp that the host loops call) and cuBLAS SGEMM with TF32
// off (common/device/gpu/linear.cpp). Memory comes from CUDA's stream-ordered pool (zero-filled);
// copies use cudaMemcpyDefault, which under unified virtual addressing finds each side's place
// itself (common/device/gpu/device.cpp). Each host thread's calls run on its own stream, in
// launch order; the reductions (a loss, a norm) synchronise it, and a communication job is
// ordered after the work it was handed (mark_queued_work: an event at submit). Differences from the
// host: float32 rounding only (cuBLAS sums a product's terms in another order than Eigen; per-block
// partial sums; FMA contraction), measured by scripts/gpu-check. Written over
// common/device/gpu/device.hpp only, so the CPU emulation of that layer (tests/emul) runs this file
// too.
#include <memory>
#include <vector>

#include "common/core/check.hpp"
#include "common/core/device_backend.hpp"
#include "common/device/gpu/device.hpp"

namespace ringzero {

namespace {

// Labels on the device for one call (B int32), freed with it.
class DeviceLabels {
 public:
  DeviceLabels(std::span<const int32_t> labels, int64_t C) : bytes_(labels.size() * 4) {
    for (int32_t y : labels)
      RZ_CHECK(y >= 0 && y < C, "cross_entropy: label " << y << " outside [0, " << C << ")");
    data_ = static_cast<int32_t*>(device_alloc(bytes_, MemTag::activations));
    copy_to_device(data_, labels.data(), bytes_);
  }
  ~DeviceLabels() { device_free(data_, bytes_, MemTag::activations); }
  DeviceLabels(const DeviceLabels&) = delete;
  DeviceLabels& operator=(const DeviceLabels&) = delete;
  const int32_t* data() const { return data_; }

 private:
  int64_t bytes_;
  int32_t* data_ = nullptr;
};

class CudaBackend : public DeviceBackend {
 public:
  CudaBackend() : name_(require_gpu(0)) {}
  std::string name() const override { return name_; }

  void* allocate(int64_t bytes) override { return pool_allocate(bytes, "a tensor", true); }
  void free(void* p) override { pool_free(p); }
  void* allocate_staging(int64_t bytes) override { return allocate_pinned(bytes); }
  void free_staging(void* p) override { free_pinned(p); }
  void copy(void* dst, const void* src, int64_t bytes) override { copy_any(dst, src, bytes); }
  void zero(void* p, int64_t bytes) override { zero_bytes(p, bytes); }
  std::shared_ptr<void> mark_queued_work(bool timed) override {
    return {record_stream_event(timed), destroy_stream_event};
  }
  double elapsed_ms(const std::shared_ptr<void>& from, const std::shared_ptr<void>& to) override {
    return stream_event_elapsed_ms(from.get(), to.get());
  }
  void wait_for_mark(const std::shared_ptr<void>& mark) override {
    if (mark) wait_stream_event(mark.get());
  }
  void finish_queued_work() override { synchronize_stream(); }

  void linear_forward(const Tensor& out, const Tensor& inp, const Tensor& weight,
                      const Tensor& bias) override {
    gpu::linear_forward(out.data(), inp.data(), weight.data(), bias.data(), inp.rows(),
                        inp.cols(), weight.rows());
  }
  void linear_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                       const Tensor& dout, const Tensor& inp, const Tensor& weight) override {
    gpu::linear_backward(dinp.defined() ? dinp.data() : nullptr, dweight.data(), dbias.data(),
                         dout.data(), inp.data(), weight.data(), inp.rows(), inp.cols(),
                         weight.rows());
  }
  void relu_forward(const Tensor& out, const Tensor& inp) override {
    gpu::relu_forward(out.data(), inp.data(), inp.numel());
  }
  void relu_backward(const Tensor& dinp, const Tensor& dout, const Tensor& out) override {
    gpu::relu_backward(dinp.data(), dout.data(), out.data(), out.numel());
  }
  float mse_forward(const Tensor& pred, const Tensor& target) override {
    const double sum = gpu::squared_error_sum(pred.data(), target.data(), pred.numel());
    return static_cast<float>(sum / static_cast<double>(pred.numel()));
  }
  void mse_backward(const Tensor& dpred, float dloss, const Tensor& pred,
                    const Tensor& target) override {
    gpu::mse_backward(dpred.data(), pred.data(), target.data(), pred.numel(),
                      2.0f * dloss / static_cast<float>(pred.numel()));
  }
  float cross_entropy_forward(const Tensor& probs, const Tensor& logits,
                              std::span<const int32_t> labels) override {
    const int64_t B = logits.rows(), C = logits.cols();
    const DeviceLabels device_labels(labels, C);
    const Tensor row_nll = Tensor::zeros({B, 2}, MemTag::activations, Device::cuda);  // B doubles
    auto* nll_device = reinterpret_cast<double*>(row_nll.data());
    gpu::cross_entropy_forward(probs.data(), nll_device, logits.data(), device_labels.data(), B, C);
    std::vector<double> nll(static_cast<size_t>(B));
    copy_to_host(nll.data(), nll_device, B * 8);
    double sum = 0.0;  // in row order, as the host's cross_entropy_forward
    for (double x : nll) sum += x;
    return static_cast<float>(sum / static_cast<double>(B));
  }
  void cross_entropy_backward(const Tensor& dlogits, float dloss, const Tensor& probs,
                              std::span<const int32_t> labels) override {
    const int64_t B = probs.rows(), C = probs.cols();
    const DeviceLabels device_labels(labels, C);
    gpu::cross_entropy_backward(dlogits.data(), probs.data(), device_labels.data(), B, C,
                                dloss / static_cast<float>(B));
  }

  void adamw_update(float* p, float* m, float* v, const float* g, int64_t n,
                    const kernels::AdamWStep& k) override {
    gpu::adamw_update(p, m, v, g, n, k);
  }
  void sgd_update(float* p, float* buf, const float* g, int64_t n, float lr, float momentum,
                  float weight_decay, bool first_step) override {
    gpu::sgd_update(p, buf, g, n, lr, momentum, weight_decay, first_step);
  }
  double sum_of_squares(const float* g, int64_t n, float factor) override {
    return gpu::sum_of_squares(g, n, factor);
  }
  void scale(float* g, int64_t n, float coef) override { gpu::scale(g, n, coef); }
  void divide(float* g, int64_t n, float divisor) override { gpu::divide(g, n, divisor); }
  void add(float* dst, const float* src, int64_t n) override { gpu::add(dst, src, n); }
  void to_half(Dtype dtype, const float* in, uint16_t* out, int64_t n) override {
    gpu::to_half(dtype == Dtype::bf16, in, out, n);
  }
  void to_float(Dtype dtype, const uint16_t* in, float* out, int64_t n) override {
    gpu::to_float(dtype == Dtype::bf16, in, out, n);
  }
  double sum_of_squares_half(Dtype dtype, const uint16_t* g, int64_t n, float factor) override {
    return gpu::sum_of_squares_half(dtype == Dtype::bf16, g, n, factor);
  }

 private:
  std::string name_;
};

}  // namespace

DeviceBackend& cuda_backend() {
  static CudaBackend backend;
  return backend;
}

}  // namespace ringzero
