// bf16 and fp16 conversions (common/core/half.hpp) against PyTorch's: the table in half_table.inc
// was computed by tests/golden/make_half_table.py with torch.Tensor.to (and NumPy for fp16),
// not by the code under test. Every check is bitwise: a conversion is exact or wrong.
// Then properties over every 16-bit pattern and a million random float32 patterns: the vector
// loops (F16C, auto-vectorised bf16) give the scalar functions' bits, 16 -> 32 -> 16 is the
// identity, and the product of two 16-bit values is exact in float32 (why an fp32 GEMM on
// 16-bit values is a 16-bit GEMM with fp32 accumulation, common/precision/mixed.hpp).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <vector>

#include "common/core/half.hpp"
#include "common/core/rng.hpp"

using namespace ringzero;
using Catch::Matchers::Contains;

namespace {

struct Row {
  uint32_t in;
  uint16_t bf16, fp16;
};
const Row kTable[] = {
#include "half_table.inc"
};

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

bool is_nan_bf16(uint16_t h) {
  return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0;
}
bool is_nan_fp16(uint16_t h) {
  return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
}

}  // namespace

TEST_CASE("float -> bf16 / fp16 match PyTorch on the edge-value table", "[half]") {
  std::vector<float> in;
  for (const Row& r : kTable) in.push_back(from_bits(r.in));
  std::vector<uint16_t> bf(in.size()), fp(in.size());
  convert_to_half(Dtype::bf16, in, bf);  // vector paths
  convert_to_half(Dtype::fp16, in, fp);
  for (size_t i = 0; i < in.size(); ++i) {
    const Row& r = kTable[i];
    INFO("row " << i << ": float bits 0x" << std::hex << r.in << " = " << in[i]);
    if (std::isnan(in[i])) {
      // PyTorch 1.13 writes 0xFFFF for any NaN in bf16; we keep the sign and set the quiet
      // bit. Both are NaN; the sign is ours to keep.
      REQUIRE(is_nan_bf16(float_to_bf16(in[i])));
      REQUIRE(is_nan_fp16(float_to_fp16(in[i])));
      REQUIRE(is_nan_bf16(bf[i]));
      REQUIRE(is_nan_fp16(fp[i]));
      REQUIRE((float_to_bf16(in[i]) >> 15) == (r.in >> 31));
      REQUIRE((float_to_fp16(in[i]) >> 15) == (r.in >> 31));
      REQUIRE(std::isnan(bf16_to_float(bf[i])));
      REQUIRE(std::isnan(fp16_to_float(fp[i])));
      continue;
    }
    REQUIRE(float_to_bf16(in[i]) == r.bf16);
    REQUIRE(float_to_fp16(in[i]) == r.fp16);
    REQUIRE(bf[i] == r.bf16);
    REQUIRE(fp[i] == r.fp16);
  }
  REQUIRE(std::size(kTable) >= 60);
}

TEST_CASE("16 -> 32 is exact and 16 -> 32 -> 16 is the identity, for all 65536 patterns",
          "[half]") {
  std::vector<uint16_t> all(65536), back(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = static_cast<uint16_t>(h);
  std::vector<float> f(65536);
  for (Dtype d : {Dtype::bf16, Dtype::fp16}) {
    INFO(dtype_name(d));
    convert_to_float(d, all, f);
    convert_to_half(d, f, back);
    for (uint32_t h = 0; h < 65536; ++h) {
      INFO("pattern 0x" << std::hex << h);
      const float s = half_to_float(d, static_cast<uint16_t>(h));
      const bool nan = d == Dtype::bf16 ? is_nan_bf16(static_cast<uint16_t>(h))
                                        : is_nan_fp16(static_cast<uint16_t>(h));
      if (nan) {
        REQUIRE(std::isnan(f[h]));
        REQUIRE(std::isnan(s));
        REQUIRE((d == Dtype::bf16 ? is_nan_bf16(back[h]) : is_nan_fp16(back[h])));
        continue;
      }
      REQUIRE(std::memcmp(&s, &f[h], 4) == 0);  // vector == scalar, -0 included
      REQUIRE(back[h] == h);
      REQUIRE(float_to_half(d, s) == h);
    }
  }
  // Spot values: exactness of the widening, independent of the narrowing.
  REQUIRE(fp16_to_float(0x7bff) == 65504.0f);
  REQUIRE(fp16_to_float(0x0001) == 0x1p-24f);
  REQUIRE(fp16_to_float(0x03ff) == 0x1p-14f - 0x1p-24f);
  REQUIRE(bf16_to_float(0x7f7f) == 0x1.fep127f);
  REQUIRE(std::isinf(fp16_to_float(0xfc00)));
  REQUIRE(fp16_to_float(0xfc00) < 0);
}

TEST_CASE("vector conversions give the scalar bits on a million random float32 patterns",
          "[half]") {
  Rng rng(14, 1);
  std::vector<float> in(1 << 20);
  for (float& x : in) {
    const auto u = static_cast<uint32_t>(rng.next_u64());
    std::memcpy(&x, &u, 4);
  }
  std::vector<uint16_t> out(in.size());
  for (Dtype d : {Dtype::bf16, Dtype::fp16}) {
    INFO(dtype_name(d));
    convert_to_half(d, in, out);
    size_t mismatches = 0;
    for (size_t i = 0; i < in.size(); ++i) mismatches += out[i] != float_to_half(d, in[i]);
    REQUIRE(mismatches == 0);
    // round_in_place is the same rounding, kept in float32.
    std::vector<float> r(in.begin(), in.begin() + 4096);
    round_in_place(d, r);
    for (size_t i = 0; i < r.size(); ++i) {
      const float expect = half_to_float(d, float_to_half(d, in[i]));
      if (std::isnan(expect)) {
        REQUIRE(std::isnan(r[i]));
      } else {
        REQUIRE(r[i] == expect);
      }
    }
  }
}

TEST_CASE("the product of two 16-bit values is exact in float32", "[half]") {
  // bf16: 8 + 8 significant bits, fp16: 11 + 11, both within float32's 24; the exponents of
  // the products stay inside float32's normal range for the values below.
  Rng rng(14, 2);
  for (Dtype d : {Dtype::bf16, Dtype::fp16}) {
    INFO(dtype_name(d));
    for (int i = 0; i < 100000; ++i) {
      const float a = half_to_float(d, float_to_half(d, rng.normal() * 8.0f));
      const float b = half_to_float(d, float_to_half(d, rng.normal() * 1e-3f));
      REQUIRE(static_cast<double>(a * b) == static_cast<double>(a) * static_cast<double>(b));
    }
  }
}

TEST_CASE("accumulate_half adds in float32 and rounds once", "[half]") {
  // 256 + 1 in bf16: 257 needs 9 significant bits; the tie rounds to even (256).
  std::vector<uint16_t> dst{float_to_bf16(256.0f), float_to_bf16(1.0f), float_to_bf16(1e38f)};
  const std::vector<uint16_t> src{float_to_bf16(1.0f), float_to_bf16(0x1p-8f),
                                  float_to_bf16(1e38f)};
  accumulate_half(Dtype::bf16, dst, src);
  REQUIRE(bf16_to_float(dst[0]) == 256.0f);
  REQUIRE(bf16_to_float(dst[1]) == 1.0f);  // 1 + 2^-8 is a tie -> 1
  // bf16 has float32's range: 2 x 1e38 does not overflow (doubling a bf16 value is exact).
  REQUIRE(bf16_to_float(dst[2]) == 2.0f * bf16_to_float(float_to_bf16(1e38f)));
  std::vector<uint16_t> h{float_to_fp16(60000.0f)};
  accumulate_half(Dtype::fp16, h, std::vector<uint16_t>{float_to_fp16(10000.0f)});
  REQUIRE(std::isinf(fp16_to_float(h[0])));  // 70000 overflows fp16
}

// The element types the engines are written over: T::operator+= and add_into must be exactly
// accumulate_half (the ring's hop, chapter 03's star and the 16-bit gradient accumulation all
// rely on it: the typed engines are checked bit for bit against the code they replaced).
template <class T>
void check_value_type_adds_like_accumulate_half() {
  Rng rng(14, 3);
  std::vector<T> a(100000), b(a.size()), typed(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = T::from_float(rng.normal() * 1e-2f);
    b[i] = T::from_float(rng.normal() * (i % 2 ? 1e-6f : 1e-2f));  // small and like-sized
  }
  std::vector<uint16_t> dst(a.size()), src(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    dst[i] = a[i].bits;
    src[i] = b[i].bits;
  }
  accumulate_half(T::dtype, dst, src);
  typed = a;
  add_into(std::span<T>(typed), std::span<const T>(b));
  for (size_t i = 0; i < a.size(); ++i) {
    T scalar = a[i];
    scalar += b[i];
    REQUIRE(scalar.bits == dst[i]);    // operator+= : the scalar rule
    REQUIRE(typed[i].bits == dst[i]);  // add_into: the span rule, the same bits
  }
  REQUIRE(dtype_of<T>() == T::dtype);
}

TEST_CASE("bf16 and fp16 value types add as accumulate_half: widen, add in fp32, round once",
          "[half]") {
  check_value_type_adds_like_accumulate_half<bf16>();
  check_value_type_adds_like_accumulate_half<fp16>();
  // A 16-bit accumulator drops every contribution below half an ulp: 1 + 256 x 2^-9 stays 1 in
  // bf16 (ulp(1) = 2^-7), while float32 reaches 1.5 (docs/mixed-precision.md says where this
  // matters: micro-batch accumulation).
  bf16 x = bf16::from_float(1.0f);
  float f = 1.0f;
  for (int i = 0; i < 256; ++i) {
    x += bf16::from_float(0x1p-9f);
    f += 0x1p-9f;
  }
  REQUIRE(static_cast<float>(x) == 1.0f);
  REQUIRE(f == 1.5f);
  // A typed buffer is tagged at 2 bytes per element, like Buffer16.
  BufferOf<bf16> buf(10, MemTag::comm_buffers);
  REQUIRE(buf.bytes() == 20);
  REQUIRE(sizeof(bf16) == 2);
}

TEST_CASE("Buffer16 counts 2 bytes per element; parse_dtype names the flag", "[half]") {
  const int64_t before = Ledger::get().current(MemTag::gradients);
  {
    Buffer16 b(1001, MemTag::gradients);
    REQUIRE(Ledger::get().current(MemTag::gradients) - before == 2002);
    REQUIRE(b.span()[1000] == 0);
    Buffer16 moved = std::move(b);
    REQUIRE(Ledger::get().current(MemTag::gradients) - before == 2002);
  }
  REQUIRE(Ledger::get().current(MemTag::gradients) == before);
  REQUIRE(parse_dtype("bf16", "--precision") == Dtype::bf16);
  REQUIRE_THROWS_WITH(parse_dtype("half", "--precision"),
                      Contains("--precision half") && Contains("fp32, bf16 or fp16"));
}
