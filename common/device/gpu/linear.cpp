// The matrix products of linear() on row-major device arrays, through gpu::sgemm (cuBLAS SGEMM,
// column-major, in common/device/gpu/device.cpp; a reference SGEMM in tests/emul/ for the CPU
// tests). A row-major array X (R, C) is the column-major array Xᵀ (C, R) with leading dimension C,
// so each row-major product is issued as the column-major product of the transposes.
#include "common/device/gpu/device.hpp"

namespace ringzero::gpu {

// out (B, OC) = inp (B, C) · weightᵀ:  column-major outᵀ (OC, B) = op_T(weight as (C, OC)) ·
// inpᵀ (C, B).
void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int64_t B,
                    int64_t C, int64_t OC) {
  sgemm(true, false, OC, B, C, 1.0f, weight, C, inp, C, 0.0f, out, OC);
  bias_add(out, bias, B, OC);
}

void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int64_t B, int64_t C, int64_t OC) {
  // dinp (B, C) += dout (B, OC) · weight (OC, C):  column-major dinpᵀ (C, B) += weightᵀ · doutᵀ
  if (dinp != nullptr) sgemm(false, false, C, B, OC, 1.0f, weight, C, dout, OC, 1.0f, dinp, C);
  // dweight (OC, C) += doutᵀ · inp (B, C):  column-major dweightᵀ (C, OC) += inpᵀ (C, B) · dout
  sgemm(false, true, C, OC, B, 1.0f, inp, C, dout, OC, 1.0f, dweight, C);
  bias_backward(dbias, dout, B, OC);
}

// row-major C (M, N) = A (M, K) · B (K, N):  column-major Cᵀ (N, M) = Bᵀ (N, K) · Aᵀ (K, M)
void matmul(float* c, const float* a, const float* b, int64_t M, int64_t N, int64_t K) {
  sgemm(false, false, N, M, K, 1.0f, b, N, a, K, 0.0f, c, N);
}

}  // namespace ringzero::gpu
