// half: the two 16-bit floating-point formats of mixed-precision training, and their buffers.
//
// Provides: Dtype (fp32 | bf16 | fp16) and its flag spelling; scalar conversions float <-> bf16
// and float <-> fp16 that round to nearest, ties to even (IEEE 754 roundTiesToEven, what
// torch.Tensor.to(torch.bfloat16 / torch.float16) does on CPU); loops converting whole spans
// (F16C instructions for fp16 where the compiler targets them, a branch-free loop GCC
// vectorises for bf16); round_in_place (a float32 span rounded to the nearest 16-bit values,
// kept in float32); and Buffer16, an owning 16-bit array tagged in the Ledger at 2 bytes per
// element, so 16-bit parameters and gradients are counted as 2Ψ.
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

#include "ledger.hpp"

namespace ringzero {

/// The element type of parameters and gradients during forward and backward (--precision) or
/// of gradients on the wire (--reduce-dtype).
enum class Dtype { fp32, bf16, fp16 };

/// "fp32" | "bf16" | "fp16". Errors: any other spelling (message names the value and the
/// accepted ones; `flag` is the flag to name, e.g. "--precision").
Dtype parse_dtype(const std::string& name, const std::string& flag);
const char* dtype_name(Dtype dtype);

/// float -> bf16 bits, round to nearest even; NaN -> quiet NaN with the same sign.
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  // Adding 0x7fff plus the lowest kept bit rounds the upper half to nearest, ties to even;
  // a carry out of the mantissa increments the exponent, which is the correct rounding
  // (up to inf past the largest finite bf16).
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

/// bf16 bits -> float (exact: the bits become the upper half of a float32).
inline float bf16_to_float(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

/// float -> fp16 bits, round to nearest even; |f| >= 65520 (halfway past 65504) -> ±inf;
/// values below 2^-14 become subnormals (or ±0 below 2^-25); NaN -> quiet NaN, same sign.
uint16_t float_to_fp16(float f);
/// fp16 bits -> float (exact).
float fp16_to_float(uint16_t h);

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

}  // namespace ringzero
