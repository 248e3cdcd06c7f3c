// libFuzzer target: decode_idx_gz on arbitrary bytes (issue 9, item 5). The first input byte
// chooses the expected number of dimensions (1 or 3, as the labels and images files), the rest
// is the .gz file. Built and run as fuzz_safetensors.cpp (tests/fuzz/build.sh, ctest fuzz_idx).
// A finding is a crash, a sanitizer report, a leak, an allocation beyond libFuzzer's
// -malloc_limit_mb, or an exception that is not ringzero::Error.
#include <cstddef>
#include <cstdint>
#include <span>

#include "common/core/check.hpp"
#include "common/data/data.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int ndim = (data[0] & 1) ? 3 : 1;
  try {
    auto arr = ringzero::decode_idx_gz(std::span<const uint8_t>(data + 1, size - 1), "fuzz", ndim);
    int64_t total = 1;
    for (int64_t d : arr.dims) total *= d;  // already checked by the decoder
    if (static_cast<int64_t>(arr.data.size()) != total) __builtin_trap();
  } catch (const ringzero::Error&) {
    // the expected outcome for malformed input
  }
  return 0;
}
