// device_backend: the operation table a device provides, below the tensor.
//
// Provides: DeviceBackend, the table each non-host device fills (as needle's backends register one
// operation table; here the host keeps its loops and is not a table. Autograd, ops and nn name no
// backend: they allocate where their inputs live and dispatch), and backend_of, the one line each
// operation of common/core/ops.cpp, common/core/optim.cpp and common/core/half.cpp runs before its
// host loop:
//     if (DeviceBackend* d = backend_of({out.data(), inp.data()})) return d->relu_forward(...);
//     for (...) out[i] = kernels::relu(inp[i]);        // the host loop, unchanged
// so a chapter's train_step, written over tensors and spans, runs wherever its model lives.
// Two backends: emulated (common/core/emulated_device.cpp: the host functions on a second mapping
// of PROT_NONE device memory, so the same bits as the CPU) and cuda
// (common/device/gpu/cuda_backend.cpp: the kernels of common/device/gpu/kernels.cu around the
// element functions of common/core/kernels.hpp, and cuBLAS SGEMM). The host is not a backend: null
// from backend_of means "run the loop below". Communication needs one entry, the host memory a
// staged message goes through (allocate_staging: page-locked on CUDA); the communicator hands a GPU
// buffer's message to NCCL instead where it can (common/comm/device_transport.hpp).
// 16-bit storage needs three entries, the conversions and the 16-bit norm: common/core/half.cpp
// and common/precision/mixed.cpp build the rest (accumulation, rounding, the overflow test, the
// master weights' update) from them and the float32 entries. Leaves out: fused 16-bit kernels.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>

#include "common/core/device_memory.hpp"
#include "common/core/half.hpp"
#include "common/core/tensor.hpp"

namespace ringzero {

namespace kernels {
struct AdamWStep;  // common/core/kernels.hpp, not included: it holds exercise regions (optim.hpp)
}

/// The operations of one device. Every pointer and tensor argument lives on this device; labels
/// are host spans (copied over by the backend). Semantics are the host functions' of the same
/// name (common/core/ops.hpp, common/core/optim.hpp): d-buffers ACCUMULATE (+=), reductions return
/// to the host and synchronise.
class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  /// What the start-up line and the summary's "device" field say ("NVIDIA H200", ...).
  virtual std::string name() const = 0;

  // Memory (device_memory.hpp calls these; the chapters never do).
  virtual void* allocate(int64_t bytes) = 0;  ///< zero-filled; errors name the bytes
  virtual void free(void* p) = 0;
  /// dst, src each on the host or on this device; synchronous.
  virtual void copy(void* dst, const void* src, int64_t bytes) = 0;
  virtual void zero(void* p, int64_t bytes) = 0;
  /// Host memory for the host side of a staged message (common/comm/mpi_stage.hpp's HostStage:
  /// copied from and to this device around MPI): uninitialised, not counted in the ledger. CUDA:
  /// page-locked (cudaHostAlloc), so the copies run at the link's full bandwidth without a
  /// bounce buffer (CUDA best practices guide, "Pinned Memory"); ordinary memory by default.
  /// Errors: out of memory, naming the bytes.
  virtual void* allocate_staging(int64_t bytes);
  virtual void free_staging(void* p);

  // Order between host threads (the step's and the communication thread, comm_thread.hpp). On
  // CUDA each host thread queues its kernels and copies on a stream of its own (the per-thread
  // default stream), so a collective's adds and copies run beside the backward's kernels; these
  // three calls order the two where a job is handed over. No-ops by default: a device whose
  // every call is complete when it returns (the emulated one) needs no order.
  /// A mark after the work the calling thread has queued on this device so far (CUDA: an event
  /// recorded on its stream; `timed`: one that elapsed_ms can read); null when there is nothing
  /// to mark.
  virtual std::shared_ptr<void> mark_queued_work(bool timed = false) {
    (void)timed;
    return nullptr;
  }
  /// Milliseconds on the device from timed mark `from` to timed mark `to` (negative when `to`
  /// ran first); waits until `to` has run (CUDA: cudaEventElapsedTime, about 0.5 µs resolution).
  virtual double elapsed_ms(const std::shared_ptr<void>& from, const std::shared_ptr<void>& to) {
    (void)from, (void)to;
    return 0;
  }
  /// The calling thread's later work on this device runs after `mark` (CUDA:
  /// cudaStreamWaitEvent on its stream; no host wait). Null: nothing to wait for.
  virtual void wait_for_mark(const std::shared_ptr<void>& mark) { (void)mark; }
  /// Blocks until the work the calling thread has queued on this device is done (CUDA:
  /// cudaStreamSynchronize on its stream).
  virtual void finish_queued_work() {}

  // The model's operations (common/core/ops.hpp).
  virtual void linear_forward(const Tensor& out, const Tensor& inp, const Tensor& weight,
                              const Tensor& bias) = 0;
  /// dinp may be undefined (the first layer's input needs no gradient).
  virtual void linear_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                               const Tensor& dout, const Tensor& inp, const Tensor& weight) = 0;
  virtual void relu_forward(const Tensor& out, const Tensor& inp) = 0;
  virtual void relu_backward(const Tensor& dinp, const Tensor& dout, const Tensor& out) = 0;
  virtual float mse_forward(const Tensor& pred, const Tensor& target) = 0;
  virtual void mse_backward(const Tensor& dpred, float dloss, const Tensor& pred,
                            const Tensor& target) = 0;
  /// Errors: a label outside [0, C) (checked on the host before it is copied).
  virtual float cross_entropy_forward(const Tensor& probs, const Tensor& logits,
                                      std::span<const int32_t> labels) = 0;
  virtual void cross_entropy_backward(const Tensor& dlogits, float dloss, const Tensor& probs,
                                      std::span<const int32_t> labels) = 0;

  // The optimizers' element updates and clipping (common/core/optim.hpp), on n elements.
  virtual void adamw_update(float* p, float* m, float* v, const float* g, int64_t n,
                            const kernels::AdamWStep& k) = 0;
  /// buf may be null when momentum == 0.
  virtual void sgd_update(float* p, float* buf, const float* g, int64_t n, float lr,
                          float momentum, float weight_decay, bool first_step) = 0;
  /// Σ (g · factor)² in float64 (factor 1: Σ g², clip_grad_norm_'s; else mixed precision's
  /// unscaled norm, common/core/half.hpp).
  virtual double sum_of_squares(const float* g, int64_t n, float factor) = 0;
  virtual void scale(float* g, int64_t n, float coef) = 0;
  /// g /= divisor on n elements (the mean over ranks: a division, as the host's).
  virtual void divide(float* g, int64_t n, float divisor) = 0;
  /// dst += src on n elements (a reduction's add: common/core/half.hpp's add_into).
  virtual void add(float* dst, const float* src, int64_t n) = 0;

  // 16-bit storage (common/core/half.hpp; dtype is bf16 or fp16, never fp32). The conversions
  // are the host's bits (the emulated backend runs the host's loops; CUDA one thread per element
  // of common/core/half_kernels.hpp, the scalar functions those loops vectorise).
  /// out[i] = to_16(in[i]) on n elements, round to nearest even (convert_to_half).
  virtual void to_half(Dtype dtype, const float* in, uint16_t* out, int64_t n) = 0;
  /// out[i] = to_32(in[i]) on n elements, exact (convert_to_float).
  virtual void to_float(Dtype dtype, const uint16_t* in, float* out, int64_t n) = 0;
  /// Σ (to_32(g) · factor)² in float64 (sum_of_squares_half: the 16-bit norm and overflow test).
  virtual double sum_of_squares_half(Dtype dtype, const uint16_t* g, int64_t n, float factor) = 0;
};

/// The backend of `device` (not cpu), created on first use. Errors: cuda in a program built
/// without the GPU library (reconfigure with -DRINGZERO_CUDA=ON) or on a machine without a GPU
/// (use --device cpu).
DeviceBackend& backend(Device device);
/// The emulated backend (emulated_device.cpp).
DeviceBackend& emulated_backend();
/// The CUDA backend (common/device/gpu/cuda_backend.cpp, in the GPU library of a CUDA build).
DeviceBackend& cuda_backend();
/// What backend(cuda) calls: null unless the program links the GPU library, whose
/// common/device/gpu/register_cuda.cpp (compiled into each such executable) sets it to cuda_backend
/// before main. So the library below the GPU one never names it: no link cycle.
using BackendFactory = DeviceBackend& (*)();
BackendFactory& cuda_backend_factory();

/// The hand-over of a communication job (common/comm/comm_thread.hpp), on the CUDA backend when
/// this process has made one (else they do nothing, at the cost of an atomic load):
/// mark_device_work() where the job is submitted, wait_for_device_work(mark) on the communication
/// thread before the job, finish_device_work() after it. So a job's kernels run after the work
/// its buffers came from (DDP's bucket of gradients) and only then, and the step's thread, which
/// waits for the job on the host, finds them done. Errors: CUDA's, naming the call.
std::shared_ptr<void> mark_device_work(bool timed = false);
void wait_for_device_work(const std::shared_ptr<void>& mark);
void finish_device_work();
/// elapsed_ms of the CUDA backend: what the GPU's timeline in --trace reads (trace.hpp).
double device_elapsed_ms(const std::shared_ptr<void>& from, const std::shared_ptr<void>& to);

/// The backend of the device that holds `pointers` (nulls ignored), or null when they are all
/// on the host. Errors: pointers on two places, the host and a device or two devices (names
/// both; move one with Tensor::to or Model::to).
DeviceBackend* backend_of(std::initializer_list<const void*> pointers);

}  // namespace ringzero
