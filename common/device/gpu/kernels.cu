// kernels.cu: the GPU loops around common/core/kernels.hpp. Each kernel is one thread per element
// (or per row / column, where the CPU's inner loop runs over a row or column), with a grid-stride
// loop so any n fits in one launch. The arithmetic is the shared RZ_HD function, nothing else.
// Every launch goes to the calling host thread's stream: the library is compiled with
// CUDA_API_PER_THREAD_DEFAULT_STREAM (common/CMakeLists.txt), so stream 0 is that thread's own
// default stream, not the legacy one (device.hpp).
#include <cuda_runtime.h>

#include <vector>

#include "common/core/check.hpp"
#include "common/core/kernels.hpp"
#include "common/device/gpu/device.hpp"

namespace ringzero::gpu {

namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 1 ? 1 : (b > 65535 * 16 ? 65535 * 16 : b));
}

void check_launch(const char* what) {
  const cudaError_t rc = cudaGetLastError();
  RZ_CHECK(rc == cudaSuccess, what << " kernel launch failed: " << cudaGetErrorString(rc));
}

#define RZ_GRID_STRIDE(i, n)                                                             \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

__global__ void relu_forward_kernel(float* out, const float* inp, int64_t n) {
  RZ_GRID_STRIDE(i, n) out[i] = kernels::relu(inp[i]);
}

__global__ void relu_backward_kernel(float* dinp, const float* dout, const float* out, int64_t n) {
  RZ_GRID_STRIDE(i, n) dinp[i] += kernels::relu_grad(dout[i], out[i]);
}

__global__ void bias_add_kernel(float* out, const float* bias, int64_t B, int64_t OC) {
  RZ_GRID_STRIDE(i, B * OC) out[i] += bias[i % OC];
}

__global__ void bias_backward_kernel(float* dbias, const float* dout, int64_t B, int64_t OC) {
  RZ_GRID_STRIDE(j, OC) dbias[j] += kernels::column_sum(dout, B, OC, j);
}

__global__ void cross_entropy_forward_kernel(float* probs, double* row_nll, const float* logits,
                                             const int32_t* labels, int64_t B, int64_t C) {
  RZ_GRID_STRIDE(b, B) {
    row_nll[b] = kernels::softmax_cross_entropy_row(logits + b * C, probs + b * C, C, labels[b]);
  }
}

__global__ void cross_entropy_backward_kernel(float* dlogits, const float* probs,
                                              const int32_t* labels, int64_t B, int64_t C,
                                              float scale) {
  RZ_GRID_STRIDE(i, B * C) {
    const int64_t b = i / C, c = i % C;
    dlogits[i] += kernels::cross_entropy_grad(probs[i], c == labels[b], scale);
  }
}

// Block partial sums in float64: each thread sums its grid-stride elements, then a shared-memory
// tree per block; the host adds the block partials.
template <typename Term>
__global__ void sum_kernel(double* partials, int64_t n, Term term) {
  __shared__ double s[kThreads];
  double acc = 0.0;
  RZ_GRID_STRIDE(i, n) acc += term(i);
  s[threadIdx.x] = acc;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) s[threadIdx.x] += s[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = s[0];
}

// The block partials come from CUDA's pool on the calling thread's stream, per call: two host
// threads (the step's and the communication thread) may reduce at once, and the pool neither
// synchronises the device nor returns the memory to the driver (device.hpp's pool_allocate).
template <typename Term>
double reduce_sum(int64_t n, Term term) {
  const int blocks = n / kThreads + 1 < 1024 ? static_cast<int>(n / kThreads + 1) : 1024;
  auto* partials = static_cast<double*>(
      pool_allocate(blocks * sizeof(double), "a reduction's partial sums", /*zero=*/false));
  sum_kernel<<<blocks, kThreads, 0, cudaStreamPerThread>>>(partials, n, term);
  check_launch("sum");  // an error here ends the run: the partials are not worth freeing
  std::vector<double> host(static_cast<size_t>(blocks));
  const cudaError_t rc =
      cudaMemcpy(host.data(), partials, host.size() * sizeof(double), cudaMemcpyDeviceToHost);
  pool_free(partials);
  RZ_CHECK(rc == cudaSuccess, "reading a reduction's partial sums failed: "
                                  << cudaGetErrorString(rc));
  double total = 0.0;
  for (double x : host) total += x;
  return total;
}

struct SquaredErrorTerm {
  const float *pred, *target;
  __device__ double operator()(int64_t i) const {
    return kernels::squared_error(pred[i], target[i]);
  }
};
struct SquareTerm {  // (g · factor)², as the host's loop (factor 1: kernels::square's bits)
  const float* g;
  float factor;
  __device__ double operator()(int64_t i) const { return kernels::square(g[i] * factor); }
};
struct HalfSquareTerm {
  const uint16_t* g;
  bool bf16;
  float factor;
  __device__ double operator()(int64_t i) const {
    return kernels::square(kernels::half_to_float(bf16, g[i]) * factor);
  }
};

__global__ void mse_backward_kernel(float* dpred, const float* pred, const float* target, int64_t n,
                                    float scale) {
  RZ_GRID_STRIDE(i, n) dpred[i] += kernels::mse_grad(pred[i], target[i], scale);
}

__global__ void adamw_kernel(float* p, float* m, float* v, const float* g, int64_t n,
                             kernels::AdamWStep k) {
  RZ_GRID_STRIDE(i, n) kernels::adamw_update(p[i], m[i], v[i], g[i], k);
}

__global__ void sgd_kernel(float* p, float* buf, const float* g, int64_t n, float lr,
                           float momentum, float weight_decay, bool first_step) {
  RZ_GRID_STRIDE(i, n) {
    float unused = 0.0f;
    kernels::sgd_update(p[i], buf ? buf[i] : unused, g[i], lr, momentum, weight_decay, first_step);
  }
}

__global__ void scale_kernel(float* g, int64_t n, float coef) {
  RZ_GRID_STRIDE(i, n) g[i] *= coef;
}

__global__ void divide_kernel(float* g, int64_t n, float divisor) {
  RZ_GRID_STRIDE(i, n) g[i] /= divisor;
}

__global__ void add_kernel(float* dst, const float* src, int64_t n) {
  RZ_GRID_STRIDE(i, n) dst[i] += src[i];
}

__global__ void to_half_kernel(bool bf16, const float* in, uint16_t* out, int64_t n) {
  RZ_GRID_STRIDE(i, n) out[i] = kernels::float_to_half(bf16, in[i]);
}

__global__ void to_float_kernel(bool bf16, const uint16_t* in, float* out, int64_t n) {
  RZ_GRID_STRIDE(i, n) out[i] = kernels::half_to_float(bf16, in[i]);
}

}  // namespace

void relu_forward(float* out, const float* inp, int64_t n) {
  relu_forward_kernel<<<blocks_for(n), kThreads>>>(out, inp, n);
  check_launch("relu_forward");
}
void relu_backward(float* dinp, const float* dout, const float* out, int64_t n) {
  relu_backward_kernel<<<blocks_for(n), kThreads>>>(dinp, dout, out, n);
  check_launch("relu_backward");
}
void bias_add(float* out, const float* bias, int64_t B, int64_t OC) {
  bias_add_kernel<<<blocks_for(B * OC), kThreads>>>(out, bias, B, OC);
  check_launch("bias_add");
}
void bias_backward(float* dbias, const float* dout, int64_t B, int64_t OC) {
  bias_backward_kernel<<<blocks_for(OC), kThreads>>>(dbias, dout, B, OC);
  check_launch("bias_backward");
}
void cross_entropy_forward(float* probs, double* row_nll, const float* logits,
                           const int32_t* labels, int64_t B, int64_t C) {
  cross_entropy_forward_kernel<<<blocks_for(B), kThreads>>>(probs, row_nll, logits, labels, B, C);
  check_launch("cross_entropy_forward");
}
void cross_entropy_backward(float* dlogits, const float* probs, const int32_t* labels, int64_t B,
                            int64_t C, float scale) {
  cross_entropy_backward_kernel<<<blocks_for(B * C), kThreads>>>(dlogits, probs, labels, B, C,
                                                                 scale);
  check_launch("cross_entropy_backward");
}
double squared_error_sum(const float* pred, const float* target, int64_t n) {
  return reduce_sum(n, SquaredErrorTerm{pred, target});
}
void mse_backward(float* dpred, const float* pred, const float* target, int64_t n, float scale) {
  mse_backward_kernel<<<blocks_for(n), kThreads>>>(dpred, pred, target, n, scale);
  check_launch("mse_backward");
}
void adamw_update(float* p, float* m, float* v, const float* g, int64_t n,
                  const kernels::AdamWStep& k) {
  adamw_kernel<<<blocks_for(n), kThreads>>>(p, m, v, g, n, k);
  check_launch("adamw");
}
void sgd_update(float* p, float* buf, const float* g, int64_t n, float lr, float momentum,
                float weight_decay, bool first_step) {
  sgd_kernel<<<blocks_for(n), kThreads>>>(p, buf, g, n, lr, momentum, weight_decay, first_step);
  check_launch("sgd");
}
double sum_of_squares(const float* g, int64_t n, float factor) {
  return reduce_sum(n, SquareTerm{g, factor});
}
double sum_of_squares_half(bool bf16, const uint16_t* g, int64_t n, float factor) {
  return reduce_sum(n, HalfSquareTerm{g, bf16, factor});
}
void scale(float* g, int64_t n, float coef) {
  scale_kernel<<<blocks_for(n), kThreads>>>(g, n, coef);
  check_launch("scale");
}

void divide(float* g, int64_t n, float divisor) {
  if (n == 0) return;
  divide_kernel<<<blocks_for(n), kThreads>>>(g, n, divisor);
  check_launch("divide");
}

void add(float* dst, const float* src, int64_t n) {
  if (n == 0) return;
  add_kernel<<<blocks_for(n), kThreads>>>(dst, src, n);
  check_launch("add");
}

void to_half(bool bf16, const float* in, uint16_t* out, int64_t n) {
  if (n == 0) return;
  to_half_kernel<<<blocks_for(n), kThreads>>>(bf16, in, out, n);
  check_launch("to_half");
}

void to_float(bool bf16, const uint16_t* in, float* out, int64_t n) {
  if (n == 0) return;
  to_float_kernel<<<blocks_for(n), kThreads>>>(bf16, in, out, n);
  check_launch("to_float");
}

}  // namespace ringzero::gpu
