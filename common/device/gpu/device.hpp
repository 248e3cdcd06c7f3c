// device: GPU memory and the GPU versions of the ops and optimizers (CUDA, cuBLAS).
//
// Provides: DeviceBuffer, the device twin of Buffer (cudaMalloc, zero-filled, counted in the
// ledger's device column); the kernel launchers of common/device/gpu/kernels.cu, each a
// one-thread-per- element (row, column) loop around the same function of common/core/kernels.hpp
// that the CPU runs; and the matrix products of linear() through cuBLAS SGEMM with TF32 off unless
// asked for (set_tf32), so that they agree with Eigen to float32 rounding (cuBLAS docs,
// "cublasMath_t": CUBLAS_DEFAULT_MATH never uses TF32 tensor cores; CUBLAS_TF32_TENSOR_OP_MATH
// does). Each host thread queues on a stream of its own, its per-thread default stream (the
// library is compiled with CUDA_API_PER_THREAD_DEFAULT_STREAM): the step's kernels run in launch
// order on the step's thread's stream, the communication thread's (the ring's adds, the copies of
// a staged message) on its own, beside them; the four stream calls below order the two where a
// job is handed over (common/comm/comm_thread.hpp). Host reads (a loss, a norm) synchronise the
// calling thread's stream. Memory comes from CUDA's stream-ordered pool (cudaMallocAsync and
// cudaFreeAsync on the calling thread's stream, the pool keeping what is freed): no allocation or
// free synchronises the device, as cudaMalloc and cudaFree do.
// Built only with -DRINGZERO_CUDA=ON. The communication stream is NCCL's (nccl_transport.hpp).
// Leaves out: multi-GPU per process.
#pragma once

#include <cstdint>
#include <string>

#include "common/core/kernels.hpp"
#include "common/core/ledger.hpp"

namespace ringzero {

/// Throws (RZ_CHECK) when the calling process has no usable CUDA device, naming why and the
/// fix; otherwise selects device `device` and returns its name ("NVIDIA H200").
std::string require_gpu(int device = 0);

/// GPU memory for DeviceBuffer (defined in device.cpp, or in host memory by the CPU emulation
/// of tests/emul). Errors: cudaMalloc failure (names bytes and tag).
struct DeviceAllocator {
  static constexpr const char* kName = "DeviceBuffer";
  static float* allocate(int64_t size, MemTag tag, bool zero);  ///< cudaMallocAsync (+ memset)
  static void free(float* data);                                ///< cudaFreeAsync
};
/// An owning, zero-filled float32 array in GPU memory, tagged in the ledger's device column.
/// Move-only; size() in elements (common/core/ledger.hpp's LedgerArray).
class DeviceBuffer : public LedgerArray<float, DeviceAllocator, LedgerColumn::device> {
 public:
  using LedgerArray::LedgerArray;
  /// Host -> device: n floats from host into [offset, offset + n). Errors: out of range.
  void copy_from_host(const float* host, int64_t n, int64_t offset = 0);
  /// Device -> host: [offset, offset + n) into host. Synchronous.
  void copy_to_host(float* host, int64_t n, int64_t offset = 0) const;
  void zero();
};

/// Raw device allocation of `bytes` (labels, float64 partial sums), counted under `tag`.
void* device_alloc(int64_t bytes, MemTag tag);
void device_free(void* p, int64_t bytes, MemTag tag);
void copy_to_device(void* dst, const void* src, int64_t bytes);
void copy_to_host(void* dst, const void* src, int64_t bytes);
/// Device -> device, `bytes` bytes, in stream order with the kernels (cudaMemcpyAsync on the
/// calling thread's stream).
void copy_on_device(void* dst, const void* src, int64_t bytes);
/// Every allocation of this layer (the CUDA backend's tensors and buffers, DeviceBuffer,
/// device_alloc, a reduction's partial sums): `bytes` of GPU memory from CUDA's stream-ordered pool
/// on the calling thread's stream (cudaMallocAsync; the pool keeps what is freed), zero-filled
/// when `zero`; not counted here (the LedgerArray or Tensor that asked counts it). `what` names it
/// in the error. bytes == 0: null. Errors: cudaMallocAsync's, naming the bytes and the fix.
void* pool_allocate(int64_t bytes, const char* what, bool zero);
/// Back to the pool once the calling thread's queued work is done (cudaFreeAsync: no device-wide
/// synchronisation, as cudaFree has). Null: nothing.
void pool_free(void* p);
/// `bytes` of page-locked host memory (cudaHostAlloc), uninitialised: the host side of a staged
/// message. Errors: cudaHostAlloc's, naming the bytes.
void* allocate_pinned(int64_t bytes);
void free_pinned(void* p);
/// `bytes` from src to dst, each on the host or this GPU (cudaMemcpy with cudaMemcpyDefault:
/// unified virtual addressing finds each side); synchronous.
void copy_any(void* dst, const void* src, int64_t bytes);
/// `bytes` zero bytes at device pointer p (cudaMemsetAsync on the calling thread's stream).
void zero_bytes(void* p, int64_t bytes);
void device_synchronize();

// The calling host thread's stream (the backend's mark_queued_work, wait_for_mark and
// finish_queued_work: common/core/device_backend.hpp).
/// An event recorded after the work queued so far on the calling thread's stream (a
/// cudaEvent_t, with timing only when `timed`); free it with destroy_stream_event.
void* record_stream_event(bool timed = false);
/// Milliseconds from timed event `from` to timed event `to`, once `to` has run (it waits:
/// cudaEventSynchronize, then cudaEventElapsedTime).
double stream_event_elapsed_ms(void* from, void* to);
/// The calling thread's stream waits for `event` (cudaStreamWaitEvent; the host does not wait).
void wait_stream_event(void* event);
void destroy_stream_event(void* event);
/// Blocks until the calling thread's stream has done its queued work (cudaStreamSynchronize).
void synchronize_stream();

namespace gpu {

// Element-wise kernels. Shapes as their CPU twins in common/core/ops.hpp; pointers are device
// pointers; every d-buffer ACCUMULATES (+=), as on the CPU.
void relu_forward(float* out, const float* inp, int64_t n);
void relu_backward(float* dinp, const float* dout, const float* out, int64_t n);
/// out (B, OC) += bias (OC) on every row.
void bias_add(float* out, const float* bias, int64_t B, int64_t OC);
/// dbias (OC) += column sums of dout (B, OC), in row order: the CPU's bits.
void bias_backward(float* dbias, const float* dout, int64_t B, int64_t OC);
/// One thread per row: probs (B, C) = softmax(logits), row_nll (B) float64. labels in [0, C).
void cross_entropy_forward(float* probs, double* row_nll, const float* logits,
                           const int32_t* labels, int64_t B, int64_t C);
/// dlogits (B, C) += scale * (probs - onehot(labels)), scale = dloss / B.
void cross_entropy_backward(float* dlogits, const float* probs, const int32_t* labels, int64_t B,
                            int64_t C, float scale);
/// Σ (pred - target)² in float64 over n elements (block partials summed on the host).
double squared_error_sum(const float* pred, const float* target, int64_t n);
/// dpred += scale * (pred - target), scale = 2 dloss / n.
void mse_backward(float* dpred, const float* pred, const float* target, int64_t n, float scale);
/// AdamW on n elements with the constants of common/core/optim.hpp's adamw_step_constants().
void adamw_update(float* p, float* m, float* v, const float* g, int64_t n,
                  const kernels::AdamWStep& k);
/// SGD on n elements; buf may be null when momentum == 0.
void sgd_update(float* p, float* buf, const float* g, int64_t n, float lr, float momentum,
                float weight_decay, bool first_step);
/// Σ (g · factor)² in float64 (clip_grad_norm_'s squared norm at factor 1). Synchronises.
double sum_of_squares(const float* g, int64_t n, float factor = 1.0f);
/// Σ (to_32(g) · factor)² over bf16 (when `bf16`) or fp16 bits, in float64. Synchronises.
double sum_of_squares_half(bool bf16, const uint16_t* g, int64_t n, float factor);
/// g *= coef.
void scale(float* g, int64_t n, float coef);
/// g /= divisor (a division, not a multiplication by 1/divisor: the host's mean over ranks).
void divide(float* g, int64_t n, float divisor);
/// dst += src on n elements (the ring's and the central reducer's add, in float32).
void add(float* dst, const float* src, int64_t n);
/// out[i] = bf16 (when `bf16`) or fp16 bits of in[i], round to nearest even (half_kernels.hpp).
void to_half(bool bf16, const float* in, uint16_t* out, int64_t n);
/// out[i] = the float32 of bf16 or fp16 bits in[i] (exact).
void to_float(bool bf16, const uint16_t* in, float* out, int64_t n);

// Matrix products, cuBLAS SGEMM on row-major arrays (a row-major (R, C) array is a column-major
// (C, R) one, so each product is issued transposed).
/// out (B, OC) = inp (B, C) · weight (OC, C)ᵀ + bias (OC).
void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int64_t B,
                    int64_t C, int64_t OC);
/// dinp (B, C) += dout · weight (skipped when dinp is null); dweight (OC, C) += doutᵀ · inp;
/// dbias += column sums of dout.
void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int64_t B, int64_t C, int64_t OC);
/// cuBLAS SGEMM, column-major (BLAS convention): C (m, n) = alpha op(A) op(B) + beta C, with
/// op(X) = Xᵀ when trans is true; lda, ldb, ldc are the leading dimensions (rows of the stored
/// column-major arrays). What the three functions around it (common/device/gpu/linear.cpp) call.
void sgemm(bool transa, bool transb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
/// C (M, N) = A (M, K) · B (K, N), row-major, for the matmul benchmark.
void matmul(float* c, const float* a, const float* b, int64_t M, int64_t N, int64_t K);
/// TF32 tensor cores for the SGEMMs above: off by default (float32 results to rounding).
void set_tf32(bool on);

}  // namespace gpu
}  // namespace ringzero
