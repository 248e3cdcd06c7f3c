// The GPU layer (common/device/gpu/device.hpp), emulated on the CPU for tests/emul: memory in host
// memory, each kernel of common/device/gpu/kernels.cu as the same per-element (per-row, per-column)
// call of common/core/kernels.hpp in a plain loop, and sgemm as a reference column-major BLAS SGEMM
// (op, leading dimensions and beta exactly as cuBLAS defines them). With it, the CUDA backend
// (common/device/gpu/cuda_backend.cpp: the table, label copies, partial sums) and
// common/device/gpu/linear.cpp (the row-major/column-major transposition of every product) run, and
// every chapter runs
// --device cuda, on machines without a GPU. What it cannot test: CUDA itself
// (launch bounds, the grid-stride loops, cuBLAS's own results); scripts/gpu-check does that.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "common/core/check.hpp"
#include "common/device/gpu/device.hpp"
#include "tests/emul/stream_log.hpp"

namespace ringzero {

std::string require_gpu(int) {
  return "CPU emulation of the GPU path";
}

float* DeviceAllocator::allocate(int64_t size, MemTag, bool) {
  auto* data = static_cast<float*>(std::calloc(static_cast<size_t>(size), 4));
  RZ_CHECK(data != nullptr, "out of memory");
  return data;
}
void DeviceAllocator::free(float* data) {
  std::free(data);
}
void DeviceBuffer::copy_from_host(const float* host, int64_t n, int64_t offset) {
  RZ_CHECK(offset >= 0 && n >= 0 && offset + n <= size_, "copy out of range");
  if (n > 0) std::memcpy(data_ + offset, host, static_cast<size_t>(n) * 4);
}
void DeviceBuffer::copy_to_host(float* host, int64_t n, int64_t offset) const {
  RZ_CHECK(offset >= 0 && n >= 0 && offset + n <= size_, "copy out of range");
  if (n > 0) std::memcpy(host, data_ + offset, static_cast<size_t>(n) * 4);
}
void DeviceBuffer::zero() {
  if (size_ > 0) std::memset(data_, 0, static_cast<size_t>(size_) * 4);
}

void* device_alloc(int64_t bytes, MemTag tag) {
  if (bytes == 0) return nullptr;
  Ledger::get().add_device(tag, bytes);
  return std::calloc(static_cast<size_t>(bytes), 1);
}
void device_free(void* p, int64_t bytes, MemTag tag) {
  if (p == nullptr) return;
  Ledger::get().add_device(tag, -bytes);
  std::free(p);
}
void copy_to_device(void* dst, const void* src, int64_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, static_cast<size_t>(bytes));
}
void copy_to_host(void* dst, const void* src, int64_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, static_cast<size_t>(bytes));
}
void copy_on_device(void* dst, const void* src, int64_t bytes) {
  if (bytes > 0) std::memmove(dst, src, static_cast<size_t>(bytes));
}
void* pool_allocate(int64_t bytes, const char* what, bool) {  // always zero-filled here
  if (bytes == 0) return nullptr;
  void* p = std::calloc(static_cast<size_t>(bytes), 1);
  RZ_CHECK(p != nullptr, "out of memory: " << bytes << " bytes for " << what);
  return p;
}
void pool_free(void* p) {
  std::free(p);
}
void* allocate_pinned(int64_t bytes) {  // host memory is host memory here
  void* p = std::malloc(static_cast<size_t>(std::max<int64_t>(bytes, 1)));
  RZ_CHECK(p != nullptr, "out of memory: " << bytes << " bytes");
  return p;
}
void free_pinned(void* p) {
  std::free(p);
}
void copy_any(void* dst, const void* src, int64_t bytes) {
  std::memcpy(dst, src, static_cast<size_t>(bytes));
}
void zero_bytes(void* p, int64_t bytes) {
  std::memset(p, 0, static_cast<size_t>(bytes));
}
void device_synchronize() {}

// Streams: every emulated call is complete when it returns, so there is nothing to order; the
// calls are logged per host thread instead, for the test of the communication queue's hand-over
// (device_emulation_test.cpp).
namespace {
std::atomic<uint64_t> events_recorded{0};
}  // namespace
namespace emul {
StreamLog& stream_log() {
  thread_local StreamLog log;
  return log;
}
}  // namespace emul
// An event: its serial number and when it ran, which here is when it was recorded (the host's
// steady clock), so the GPU's timeline in --trace mirrors the host's spans.
struct EmulatedEvent {
  uint64_t serial;
  std::chrono::steady_clock::time_point at;
};
void* record_stream_event(bool) {
  const uint64_t serial = ++events_recorded;
  emul::stream_log().recorded = serial;
  return new EmulatedEvent{serial, std::chrono::steady_clock::now()};
}
double stream_event_elapsed_ms(void* from, void* to) {
  return std::chrono::duration<double, std::milli>(static_cast<EmulatedEvent*>(to)->at -
                                                   static_cast<EmulatedEvent*>(from)->at)
      .count();
}
void wait_stream_event(void* event) {
  emul::stream_log().waited = static_cast<EmulatedEvent*>(event)->serial;
}
void destroy_stream_event(void* event) {
  delete static_cast<EmulatedEvent*>(event);
}
void synchronize_stream() {
  ++emul::stream_log().synchronized;
}

namespace gpu {

void relu_forward(float* out, const float* inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = kernels::relu(inp[i]);
}
void relu_backward(float* dinp, const float* dout, const float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dinp[i] += kernels::relu_grad(dout[i], out[i]);
}
void bias_add(float* out, const float* bias, int64_t B, int64_t OC) {
  for (int64_t i = 0; i < B * OC; ++i) out[i] += bias[i % OC];
}
void bias_backward(float* dbias, const float* dout, int64_t B, int64_t OC) {
  for (int64_t j = 0; j < OC; ++j) dbias[j] += kernels::column_sum(dout, B, OC, j);
}
void cross_entropy_forward(float* probs, double* row_nll, const float* logits,
                           const int32_t* labels, int64_t B, int64_t C) {
  for (int64_t b = 0; b < B; ++b)
    row_nll[b] = kernels::softmax_cross_entropy_row(logits + b * C, probs + b * C, C, labels[b]);
}
void cross_entropy_backward(float* dlogits, const float* probs, const int32_t* labels, int64_t B,
                            int64_t C, float scale) {
  for (int64_t i = 0; i < B * C; ++i)
    dlogits[i] += kernels::cross_entropy_grad(probs[i], i % C == labels[i / C], scale);
}
double squared_error_sum(const float* pred, const float* target, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += kernels::squared_error(pred[i], target[i]);
  return s;
}
void mse_backward(float* dpred, const float* pred, const float* target, int64_t n, float scale) {
  for (int64_t i = 0; i < n; ++i) dpred[i] += kernels::mse_grad(pred[i], target[i], scale);
}
void adamw_update(float* p, float* m, float* v, const float* g, int64_t n,
                  const kernels::AdamWStep& k) {
  for (int64_t i = 0; i < n; ++i) kernels::adamw_update(p[i], m[i], v[i], g[i], k);
}
void sgd_update(float* p, float* buf, const float* g, int64_t n, float lr, float momentum,
                float weight_decay, bool first_step) {
  for (int64_t i = 0; i < n; ++i) {
    float unused = 0.0f;
    kernels::sgd_update(p[i], buf ? buf[i] : unused, g[i], lr, momentum, weight_decay, first_step);
  }
}
double sum_of_squares(const float* g, int64_t n, float factor) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += kernels::square(g[i] * factor);
  return s;
}
double sum_of_squares_half(bool bf16, const uint16_t* g, int64_t n, float factor) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += kernels::square(kernels::half_to_float(bf16, g[i]) * factor);
  return s;
}
void scale(float* g, int64_t n, float coef) {
  for (int64_t i = 0; i < n; ++i) g[i] *= coef;
}
void divide(float* g, int64_t n, float divisor) {
  for (int64_t i = 0; i < n; ++i) g[i] /= divisor;
}
void add(float* dst, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}
void to_half(bool bf16, const float* in, uint16_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = kernels::float_to_half(bf16, in[i]);
}
void to_float(bool bf16, const uint16_t* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = kernels::half_to_float(bf16, in[i]);
}

// Reference SGEMM, column-major: element (i, j) of X with leading dimension ld is X[i + j ld];
// op(A) (m, k) reads A[i + p lda] (N) or A[p + i lda] (T).
void sgemm(bool transa, bool transb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < m; ++i) {
      float s = 0.0f;
      for (int64_t p = 0; p < k; ++p)
        s +=
            (transa ? a[p + i * lda] : a[i + p * lda]) * (transb ? b[j + p * ldb] : b[p + j * ldb]);
      c[i + j * ldc] = alpha * s + (beta == 0.0f ? 0.0f : beta * c[i + j * ldc]);
    }
}
void set_tf32(bool) {}

}  // namespace gpu
}  // namespace ringzero
