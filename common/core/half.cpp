#include "common/core/half.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "common/core/check.hpp"
#include "common/core/device_backend.hpp"
#include "common/core/step_time.hpp"

#if defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>
#define RINGZERO_F16C 1
#endif

namespace ringzero {

Dtype parse_dtype(const std::string& name, const std::string& flag) {
  if (name == "fp32") return Dtype::fp32;
  if (name == "bf16") return Dtype::bf16;
  if (name == "fp16") return Dtype::fp16;
  fail(__FILE__, __LINE__,
       flag + " " + name + " is not a dtype; use " + flag + " fp32, bf16 or fp16");
}

const char* dtype_name(Dtype dtype) {
  switch (dtype) {
    case Dtype::fp32:
      return "fp32";
    case Dtype::bf16:
      return "bf16";
    case Dtype::fp16:
      return "fp16";
  }
  return "?";
}

uint16_t float_to_half(Dtype dtype, float f) {
  RZ_CHECK(dtype != Dtype::fp32, "float_to_half: dtype fp32 has no 16-bit form");
  return dtype == Dtype::bf16 ? float_to_bf16(f) : float_to_fp16(f);
}

float half_to_float(Dtype dtype, uint16_t h) {
  RZ_CHECK(dtype != Dtype::fp32, "half_to_float: dtype fp32 has no 16-bit form");
  return dtype == Dtype::bf16 ? bf16_to_float(h) : fp16_to_float(h);
}

namespace {

// The bf16 loops: no branches, so GCC vectorises them (the NaN test becomes a blend).
void floats_to_bf16(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, in + i, 4);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t nan = (u >> 16) | 0x40u;
    out[i] = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
  }
}

void bf16_to_floats(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t u = static_cast<uint32_t>(in[i]) << 16;
    std::memcpy(out + i, &u, 4);
  }
}

void floats_to_fp16(const float* in, uint16_t* out, size_t n) {
  size_t i = 0;
#ifdef RINGZERO_F16C
  // vcvtps2ph with round-to-nearest-even: the same bits as float_to_fp16 (tested).
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
#endif
  for (; i < n; ++i) out[i] = float_to_fp16(in[i]);
}

void fp16_to_floats(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
#ifdef RINGZERO_F16C
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
#endif
  for (; i < n; ++i) out[i] = fp16_to_float(in[i]);
}

void check_half(Dtype dtype, size_t a, size_t b, const char* what) {
  RZ_CHECK(dtype != Dtype::fp32, what << ": dtype fp32 has no 16-bit form");
  RZ_CHECK(a == b, what << ": sizes differ (" << a << " vs " << b << ")");
}

}  // namespace

// On a device, the conversions and the 16-bit norm are backend entries (device_backend.hpp) and
// every other 16-bit loop below is built from them and the float32 ones, in blocks
// (for_each_block, device_memory.hpp: on the host's stack, or a Scratch on the device): the
// same element functions in the same order, so the same bits. A conversion between the host and
// a device (a checkpoint's 16-bit values read out) runs where its input lives and copies the
// result over.

void convert_to_half(Dtype dtype, std::span<const float> in, std::span<uint16_t> out) {
  check_half(dtype, in.size(), out.size(), "convert_to_half");
  if (in.empty()) return;  // (an empty span's pointer may lie on another place than the output's)
  const Device from = device_of(in.data());
  if (from != device_of(out.data()))
    return for_each_block<uint16_t>(std::ssize(in), from, [&](size_t i, std::span<uint16_t> t) {
      convert_to_half(dtype, in.subspan(i, t.size()), t);
      copy_elements(std::span<const uint16_t>(t), out.subspan(i, t.size()));
    });
  const PartScope copies(StepPart::copies);  // --attribute
  if (DeviceBackend* d = backend_of({in.data(), out.data()}))
    return d->to_half(dtype, in.data(), out.data(), std::ssize(in));
  if (dtype == Dtype::bf16)
    floats_to_bf16(in.data(), out.data(), in.size());
  else
    floats_to_fp16(in.data(), out.data(), in.size());
}

void convert_to_float(Dtype dtype, std::span<const uint16_t> in, std::span<float> out) {
  check_half(dtype, in.size(), out.size(), "convert_to_float");
  if (in.empty()) return;  // (an empty span's pointer may lie on another place than the output's)
  const Device from = device_of(in.data());
  if (from != device_of(out.data()))
    return for_each_block<float>(std::ssize(in), from, [&](size_t i, std::span<float> t) {
      convert_to_float(dtype, in.subspan(i, t.size()), t);
      copy_elements(std::span<const float>(t), out.subspan(i, t.size()));
    });
  const PartScope copies(StepPart::copies);  // --attribute
  if (DeviceBackend* d = backend_of({in.data(), out.data()}))
    return d->to_float(dtype, in.data(), out.data(), std::ssize(in));
  if (dtype == Dtype::bf16)
    bf16_to_floats(in.data(), out.data(), in.size());
  else
    fp16_to_floats(in.data(), out.data(), in.size());
}

void round_in_place(Dtype dtype, std::span<float> x) {
  if (dtype == Dtype::fp32) return;
  for_each_block<uint16_t>(std::ssize(x), device_of(x.data()),
                           [&](size_t i, std::span<uint16_t> t) {
                             convert_to_half(dtype, x.subspan(i, t.size()), t);
                             convert_to_float(dtype, t, x.subspan(i, t.size()));
                           });
}

void add_into(std::span<float> dst, std::span<const float> src) {
  if (DeviceBackend* d = backend_of({dst.data(), src.data()}))
    return d->add(dst.data(), src.data(), static_cast<int64_t>(dst.size()));
  float* __restrict out = dst.data();
  const float* __restrict in = src.data();
  for (size_t i = 0; i < dst.size(); ++i) out[i] += in[i];
}

void accumulate_half(Dtype dtype, std::span<uint16_t> dst, std::span<const uint16_t> src) {
  check_half(dtype, dst.size(), src.size(), "accumulate_half");
  for_each_block<float>(std::ssize(dst), device_of(dst.data()), [&](size_t i, std::span<float> b) {
    convert_to_float(dtype, src.subspan(i, b.size()), b);
    accumulate_half(dtype, dst.subspan(i, b.size()), std::span<const float>(b));
  });
}

void accumulate_half(Dtype dtype, std::span<uint16_t> dst, std::span<const float> src) {
  check_half(dtype, dst.size(), src.size(), "accumulate_half");
  for_each_block<float>(std::ssize(dst), device_of(dst.data()), [&](size_t i, std::span<float> a) {
    convert_to_float(dtype, dst.subspan(i, a.size()), a);
    add_into(a, src.subspan(i, a.size()));  // float32, on the host or the backend
    convert_to_half(dtype, a, dst.subspan(i, a.size()));
  });
}

bool has_non_finite(Dtype dtype, std::span<const uint16_t> values) {
  RZ_CHECK(dtype != Dtype::fp32, "has_non_finite: dtype fp32 has no 16-bit form");
  if (device_of(values.data()) != Device::cpu)  // see half.hpp: finite exactly when every g is
    return !std::isfinite(sum_of_squares_half(dtype, values, 1.0f));
  const uint16_t exp_mask = dtype == Dtype::bf16 ? 0x7f80u : 0x7c00u;
  bool any = false;
  for (uint16_t h : values) any |= (h & exp_mask) == exp_mask;
  return any;
}

bool has_non_finite(std::span<const float> values) {
  if (device_of(values.data()) != Device::cpu) return !std::isfinite(sum_of_squares(values, 1.0f));
  bool any = false;
  for (float x : values) any |= !std::isfinite(x);
  return any;
}

double sum_of_squares(std::span<const float> grads, float factor) {
  if (DeviceBackend* d = backend_of({grads.data()}))
    return d->sum_of_squares(grads.data(), std::ssize(grads), factor);
  double s = 0.0;
  for (float g : grads) {
    const double x = static_cast<double>(g * factor);
    s += x * x;
  }
  return s;
}

double sum_of_squares_half(Dtype dtype, std::span<const uint16_t> grads, float factor) {
  check_half(dtype, grads.size(), grads.size(), "sum_of_squares_half");
  if (DeviceBackend* d = backend_of({grads.data()}))
    return d->sum_of_squares_half(dtype, grads.data(), std::ssize(grads), factor);
  double s = 0.0;
  for_each_block<float>(std::ssize(grads), Device::cpu, [&](size_t i, std::span<float> g) {
    convert_to_float(dtype, grads.subspan(i, g.size()), g);
    for (float v : g) {
      const double x = static_cast<double>(v * factor);
      s += x * x;
    }
  });
  return s;
}

uint16_t* Aligned16Allocator::allocate(int64_t size, MemTag tag, bool zero) {
  const size_t bytes = (static_cast<size_t>(size) * 2 + 63) / 64 * 64;
  auto* data = static_cast<uint16_t*>(std::aligned_alloc(64, bytes));
  RZ_CHECK(data != nullptr, "out of memory allocating " << bytes << " bytes for "
                                                        << mem_tag_name(tag)
                                                        << "; reduce the model or batch size");
  if (zero) std::memset(data, 0, bytes);
  return data;
}

void Aligned16Allocator::free(uint16_t* data) {
  std::free(data);
}

}  // namespace ringzero
