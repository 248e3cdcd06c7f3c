#include "common/device/gpu/device.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <utility>

#include "common/core/check.hpp"

namespace ringzero {

namespace {
void check_cuda(cudaError_t rc, const char* call) {
  RZ_CHECK(rc == cudaSuccess, call << " failed: " << cudaGetErrorString(rc));
}
void check_cublas(cublasStatus_t rc, const char* call) {
  RZ_CHECK(rc == CUBLAS_STATUS_SUCCESS, call << " failed: cuBLAS status " << static_cast<int>(rc));
}
#define CUDA_CALL(...) check_cuda((__VA_ARGS__), #__VA_ARGS__)
#define CUBLAS_CALL(...) check_cublas((__VA_ARGS__), #__VA_ARGS__)

bool tf32 = false;

// One handle, for the step's thread (the forward and backward products; the communication thread
// runs no product): a cuBLAS handle is not for two threads at once.
cublasHandle_t blas() {
  static cublasHandle_t handle = [] {
    cublasHandle_t h;
    CUBLAS_CALL(cublasCreate(&h));
    // The calling thread's stream (cudaStreamPerThread is resolved per call), like our kernels.
    CUBLAS_CALL(cublasSetStream(h, cudaStreamPerThread));
    return h;
  }();
  // CUBLAS_DEFAULT_MATH: plain float32 SGEMM (no TF32), unless set_tf32(true).
  CUBLAS_CALL(cublasSetMathMode(handle, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  return handle;
}
}  // namespace

std::string require_gpu(int device) {
  int n = 0;
  const cudaError_t rc = cudaGetDeviceCount(&n);
  RZ_CHECK(rc == cudaSuccess && n > device,
           "--device cuda: no CUDA device "
               << device << " ("
               << (rc == cudaSuccess ? std::to_string(n) + " visible"
                                     : std::string(cudaGetErrorString(rc)))
               << "); run on a machine with an NVIDIA GPU and driver, or use --device cpu");
  CUDA_CALL(cudaSetDevice(device));
  // The pool keeps what is freed for the next allocation instead of returning it to the driver
  // at each synchronisation (its default threshold, 0): a caching allocator, CUDA's own.
  cudaMemPool_t pool = nullptr;
  CUDA_CALL(cudaDeviceGetDefaultMemPool(&pool, device));
  uint64_t keep = UINT64_MAX;
  CUDA_CALL(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  cudaDeviceProp prop{};
  CUDA_CALL(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}

void* pool_allocate(int64_t bytes, const char* what, bool zero) {
  void* p = nullptr;
  if (bytes == 0) return p;
  const cudaError_t rc = cudaMallocAsync(&p, static_cast<size_t>(bytes), cudaStreamPerThread);
  RZ_CHECK(rc == cudaSuccess, "cudaMallocAsync of " << bytes << " bytes for " << what
                                                    << " failed: " << cudaGetErrorString(rc)
                                                    << "; reduce the model or batch size");
  if (zero) CUDA_CALL(cudaMemsetAsync(p, 0, static_cast<size_t>(bytes), cudaStreamPerThread));
  return p;
}

void pool_free(void* p) {
  if (p != nullptr) CUDA_CALL(cudaFreeAsync(p, cudaStreamPerThread));
}

float* DeviceAllocator::allocate(int64_t size, MemTag tag, bool zero) {
  return static_cast<float*>(pool_allocate(size * 4, mem_tag_name(tag), zero));
}

void DeviceAllocator::free(float* data) {
  pool_free(data);
}

void DeviceBuffer::copy_from_host(const float* host, int64_t n, int64_t offset) {
  RZ_CHECK(offset >= 0 && n >= 0 && offset + n <= size_,
           "copy of " << n << " floats at " << offset << " into a DeviceBuffer of " << size_);
  if (n > 0) CUDA_CALL(cudaMemcpy(data_ + offset, host, n * 4, cudaMemcpyHostToDevice));
}

void DeviceBuffer::copy_to_host(float* host, int64_t n, int64_t offset) const {
  RZ_CHECK(offset >= 0 && n >= 0 && offset + n <= size_,
           "copy of " << n << " floats at " << offset << " out of a DeviceBuffer of " << size_);
  if (n > 0) CUDA_CALL(cudaMemcpy(host, data_ + offset, n * 4, cudaMemcpyDeviceToHost));
}

void DeviceBuffer::zero() {
  if (size_ > 0)
    CUDA_CALL(cudaMemsetAsync(data_, 0, static_cast<size_t>(size_) * 4, cudaStreamPerThread));
}

void* device_alloc(int64_t bytes, MemTag tag) {
  void* p = pool_allocate(bytes, mem_tag_name(tag), false);
  if (p != nullptr) Ledger::get().add_device(tag, bytes);
  return p;
}

void device_free(void* p, int64_t bytes, MemTag tag) {
  if (p == nullptr) return;
  Ledger::get().add_device(tag, -bytes);
  pool_free(p);
}

void copy_to_device(void* dst, const void* src, int64_t bytes) {
  if (bytes > 0)
    CUDA_CALL(cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice));
}

void copy_to_host(void* dst, const void* src, int64_t bytes) {
  if (bytes > 0)
    CUDA_CALL(cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost));
}

void copy_on_device(void* dst, const void* src, int64_t bytes) {
  if (bytes > 0)
    CUDA_CALL(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice,
                              cudaStreamPerThread));
}

void* allocate_pinned(int64_t bytes) {
  void* p = nullptr;
  const cudaError_t rc = cudaHostAlloc(&p, static_cast<size_t>(bytes), cudaHostAllocDefault);
  RZ_CHECK(rc == cudaSuccess, "cudaHostAlloc of " << bytes << " bytes (a staged message) failed: "
                                                  << cudaGetErrorString(rc)
                                                  << "; use NCCL (--device-comm nccl)");
  return p;
}

void free_pinned(void* p) {
  cudaFreeHost(p);
}

void copy_any(void* dst, const void* src, int64_t bytes) {
  CUDA_CALL(cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyDefault));
}

void zero_bytes(void* p, int64_t bytes) {
  CUDA_CALL(cudaMemsetAsync(p, 0, static_cast<size_t>(bytes), cudaStreamPerThread));
}

void device_synchronize() {
  CUDA_CALL(cudaDeviceSynchronize());
}

void* record_stream_event(bool timed) {
  cudaEvent_t event = nullptr;
  CUDA_CALL(cudaEventCreateWithFlags(&event, timed ? cudaEventDefault : cudaEventDisableTiming));
  CUDA_CALL(cudaEventRecord(event, cudaStreamPerThread));
  return event;
}

double stream_event_elapsed_ms(void* from, void* to) {
  CUDA_CALL(cudaEventSynchronize(static_cast<cudaEvent_t>(to)));
  float ms = 0;
  CUDA_CALL(
      cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(from), static_cast<cudaEvent_t>(to)));
  return ms;
}

void wait_stream_event(void* event) {
  CUDA_CALL(cudaStreamWaitEvent(cudaStreamPerThread, static_cast<cudaEvent_t>(event), 0));
}

void destroy_stream_event(void* event) {
  cudaEventDestroy(static_cast<cudaEvent_t>(event));  // released once it has completed
}

void synchronize_stream() {
  CUDA_CALL(cudaStreamSynchronize(cudaStreamPerThread));
}

namespace gpu {

void set_tf32(bool on) {
  tf32 = on;
}

void sgemm(bool transa, bool transb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  RZ_CHECK(std::max({m, n, k, lda, ldb, ldc}) <= INT_MAX,
           "sgemm (" << m << ", " << n << ", " << k << ") exceeds cuBLAS's 32-bit sizes");
  CUBLAS_CALL(cublasSgemm(
      blas(), transa ? CUBLAS_OP_T : CUBLAS_OP_N, transb ? CUBLAS_OP_T : CUBLAS_OP_N,
      static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), &alpha, a,
      static_cast<int>(lda), b, static_cast<int>(ldb), &beta, c, static_cast<int>(ldc)));
}

}  // namespace gpu
}  // namespace ringzero
