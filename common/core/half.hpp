// half: the two 16-bit floating-point formats of mixed-precision training, and their buffers.
//
// Provides: Dtype (fp32 | bf16 | fp16) and its flag spelling; scalar conversions float <-> bf16
// and float <-> fp16 that round to nearest, ties to even (IEEE 754 roundTiesToEven, what
// torch.Tensor.to(torch.bfloat16 / torch.float16) does on CPU); loops converting whole spans
// (F16C instructions for fp16 where the compiler targets them, a branch-free loop GCC
// vectorises for bf16); round_in_place (a float32 span rounded to the nearest 16-bit values,
// kept in float32); 16-bit accumulation; the overflow test and the norms of mixed precision; and
// Buffer16, an owning 16-bit array tagged in the Ledger at 2 bytes per element, so 16-bit
// parameters and gradients are counted as 2Ψ. Each span function runs where its spans live: the
// host, or a device through its backend (common/core/device_backend.hpp).
//
// The formats (IEEE 754-2008 binary16; bfloat16 as in Kalamkar et al. 2019, "A Study of
// BFLOAT16 for Deep Learning Training", §2):
//   fp16  1 sign, 5 exponent (bias 15), 10 mantissa bits: max 65504, min normal 2^-14,
//         min subnormal 2^-24; a float beyond the largest finite value rounds to ±inf.
//   bf16  1 sign, 8 exponent (bias 127), 7 mantissa bits: the upper half of a float32, same
//         range (max ≈ 3.39e38), 8 significant bits; subnormals kept (torch keeps them too).
// NaN stays NaN (quiet, sign kept), ±inf stays ±inf, -0 stays -0, in both directions.
// 16 -> 32 is exact. Errors: none (every float has a 16-bit rounding).
// Leaves out: stochastic rounding, fp8.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <type_traits>

#include "common/core/half_kernels.hpp"
#include "common/core/ledger.hpp"

namespace ringzero {

/// The element type of parameters and gradients during forward and backward (--precision) or
/// of gradients on the wire (--reduce-dtype).
enum class Dtype { fp32, bf16, fp16 };

/// "fp32" | "bf16" | "fp16". Errors: any other spelling (message names the value and the
/// accepted ones; `flag` is the flag to name, e.g. "--precision").
Dtype parse_dtype(const std::string& name, const std::string& flag);
const char* dtype_name(Dtype dtype);
/// Bytes per element: 4 for fp32, 2 for bf16 and fp16.
constexpr int dtype_bytes(Dtype dtype) {
  return dtype == Dtype::fp32 ? 4 : 2;
}

/// The scalar conversions (common/core/half_kernels.hpp, the GPU's too): float -> bf16 or fp16
/// bits, round to nearest even (fp16: |f| >= 65520 -> ±inf, subnormals below 2^-14); and back,
/// exactly.
using kernels::bf16_to_float;
using kernels::float_to_bf16;
using kernels::float_to_fp16;
using kernels::fp16_to_float;

/// Scalar dispatch on a 16-bit dtype. Errors: dtype fp32.
uint16_t float_to_half(Dtype dtype, float f);
float half_to_float(Dtype dtype, uint16_t h);

/// out[i] = to_16(in[i]) for every i. Errors: sizes differ, dtype fp32.
void convert_to_half(Dtype dtype, std::span<const float> in, std::span<uint16_t> out);
/// out[i] = to_32(in[i]) (exact). Errors: sizes differ, dtype fp32.
void convert_to_float(Dtype dtype, std::span<const uint16_t> in, std::span<float> out);
/// x[i] = to_32(to_16(x[i])): the nearest 16-bit value, kept in float32. fp32: no change.
void round_in_place(Dtype dtype, std::span<float> x);
/// dst[i] = to_16(to_32(dst[i]) + to_32(src[i])): one 16-bit accumulation, the sum formed in
/// float32 and rounded once (how a 16-bit gradient accumulates, and one hop of a 16-bit ring
/// sum). Errors: sizes differ, dtype fp32.
void accumulate_half(Dtype dtype, std::span<uint16_t> dst, std::span<const uint16_t> src);
/// dst[i] = to_16(to_32(dst[i]) + src[i]): an fp32 value (an fp32 sum over ranks,
/// --reduce-dtype fp32) added into a 16-bit value with one rounding. Errors: sizes differ,
/// dtype fp32.
void accumulate_half(Dtype dtype, std::span<uint16_t> dst, std::span<const float> src);

/// The overflow test and the clipping norm of mixed precision (fp16's loss scaler, clip_grad_norm_
/// over 16-bit or fp32-summed gradients), on the host or a device (its backend's
/// sum_of_squares(_half): a float64 Σ g² is finite exactly when every g is, since a finite float32
/// squared stays below 1.2e77).
/// Whether any element is ±inf or NaN (a 16-bit exponent of all ones). Errors: dtype fp32.
bool has_non_finite(Dtype dtype, std::span<const uint16_t> values);
/// Whether any float32 element is ±inf or NaN.
bool has_non_finite(std::span<const float> values);
/// Σ (to_fp32(g) * factor)², accumulated in float64 in element order.
double sum_of_squares_half(Dtype dtype, std::span<const uint16_t> grads, float factor);
/// Σ (g * factor)² over float32 gradients, accumulated in float64 in element order.
double sum_of_squares(std::span<const float> grads, float factor);

/// Memory for Buffer16: 64-byte aligned (aligned_alloc). Errors: out of memory (names bytes
/// and tag).
struct Aligned16Allocator {
  static constexpr const char* kName = "Buffer16";
  static uint16_t* allocate(int64_t size, MemTag tag, bool zero);
  static void free(uint16_t* data);
};

/// An owning, zero-initialised, 64-byte-aligned array of 16-bit values, tagged in the Ledger
/// at 2 bytes per element. Move-only. Which 16-bit format it holds is the owner's business.
using Buffer16 = LedgerArray<uint16_t, Aligned16Allocator>;

// ---- The element types the engines are written over: float, bf16, fp16 -----------------------

/// bf16 and fp16 as value types (llm.c's floatX, c10::BFloat16 / c10::Half): 16 bits of
/// storage. `a += b` is one 16-bit accumulation: both widened to float32 (exact), added, the sum
/// rounded once to nearest even (accumulate_half's rule; what NCCL's bf16/fp16 sum does per hop
/// and PyTorch's AccumulateGrad on a bf16 .grad). Trivially copyable, 2 bytes, no padding: a
/// span of them is the bits that cross the wire.
template <Dtype D>
struct Float16 {
  static_assert(D == Dtype::bf16 || D == Dtype::fp16);
  uint16_t bits = 0;
  static constexpr Dtype dtype = D;
  static Float16 from_float(float f) { return {round(f)}; }
  explicit operator float() const { return widen(bits); }
  Float16& operator+=(Float16 other) {
    bits = round(widen(bits) + widen(other.bits));
    return *this;
  }

 private:
  static uint16_t round(float f) {
    if constexpr (D == Dtype::bf16) return float_to_bf16(f);
    else return float_to_fp16(f);
  }
  static float widen(uint16_t h) {
    if constexpr (D == Dtype::bf16) return bf16_to_float(h);
    else return fp16_to_float(h);
  }
};
using bf16 = Float16<Dtype::bf16>;  ///< 1 sign, 8 exponent, 7 mantissa bits
using fp16 = Float16<Dtype::fp16>;  ///< IEEE binary16: 1 sign, 5 exponent, 10 mantissa bits

static_assert(sizeof(bf16) == 2 && alignof(bf16) == alignof(uint16_t) &&
              std::is_trivially_copyable_v<bf16> && std::is_standard_layout_v<bf16>);
static_assert(sizeof(fp16) == 2 && alignof(fp16) == alignof(uint16_t) &&
              std::is_trivially_copyable_v<fp16> && std::is_standard_layout_v<fp16>);

/// bf16 or fp16.
template <class T>
concept Half = std::is_same_v<T, bf16> || std::is_same_v<T, fp16>;
/// float, bf16 or fp16: the element types parameters, gradients and wire buffers take.
template <class T>
concept Element = std::is_same_v<T, float> || Half<T>;

/// The Dtype of an element type.
template <Element T>
constexpr Dtype dtype_of() {
  if constexpr (std::is_same_v<T, float>) return Dtype::fp32;
  else return T::dtype;
}

/// A 16-bit buffer's bits seen as its element type, and back (the storage is raw aligned_alloc
/// memory holding 2-byte values; the element type is the owner's, as a PyTorch tensor's bytes
/// are read as c10::BFloat16).
template <Half T>
std::span<T> as_elements(std::span<uint16_t> bits) {
  return {reinterpret_cast<T*>(bits.data()), bits.size()};
}
template <Half T>
std::span<uint16_t> as_bits(std::span<T> values) {
  return {reinterpret_cast<uint16_t*>(values.data()), values.size()};
}
template <Half T>
std::span<const uint16_t> as_bits(std::span<const T> values) {
  return {reinterpret_cast<const uint16_t*>(values.data()), values.size()};
}

/// dst[i] += src[i] for every i, in the element type's arithmetic: float32 adds; bf16/fp16 add in
/// float32 and round once (the same numbers as T::operator+=, through accumulate_half's
/// vectorised loop). Errors: sizes differ (16-bit).
/// float32 runs where the spans live (the host, or a device's backend).
void add_into(std::span<float> dst, std::span<const float> src);
template <Half T>
void add_into(std::span<T> dst, std::span<const T> src) {
  accumulate_half(T::dtype, as_bits(dst), as_bits(src));
}

/// Memory for a buffer of bf16 or fp16 values: Aligned16Allocator's, typed.
template <Half T>
struct HalfAllocator {
  static constexpr const char* kName = "Buffer16";
  static T* allocate(int64_t size, MemTag tag, bool zero) {
    return reinterpret_cast<T*>(Aligned16Allocator::allocate(size, tag, zero));
  }
  static void free(T* data) { Aligned16Allocator::free(reinterpret_cast<uint16_t*>(data)); }
};

namespace half_detail {
template <class T>
struct BufferFor;
template <>
struct BufferFor<float> {
  using type = Buffer;
};
template <>
struct BufferFor<uint16_t> {
  using type = Buffer16;
};
template <Half T>
struct BufferFor<T> {
  using type = LedgerArray<T, HalfAllocator<T>>;
};
}  // namespace half_detail

/// The owning buffer of an element type: Buffer (float), a ledger-tagged array of bf16/fp16
/// (2 bytes per element), or Buffer16 (raw 16-bit bits).
template <class T>
using BufferOf = typename half_detail::BufferFor<T>::type;

}  // namespace ringzero
