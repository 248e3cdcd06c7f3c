// libFuzzer target: parse_safetensors on arbitrary bytes (issue 9, item 5). Built with clang
// -fsanitize=fuzzer,address,undefined by tests/fuzz/build.sh; run by ctest (fuzz_safetensors)
// for a bounded time from the seed corpus in tests/fuzz/corpus/safetensors.
// A finding is a crash, a sanitizer report, a leak or an exception that is not ringzero::Error:
// every malformed file must end in an Error naming the file.
#include <cstddef>
#include <cstdint>
#include <span>

#include "common/core/check.hpp"
#include "common/io/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto tensors = ringzero::parse_safetensors(std::span<const uint8_t>(data, size), "fuzz");
    // A file that parses must describe exactly its own data section.
    size_t bytes = 0;
    for (const auto& [name, t] : tensors) bytes += t.values.size() * sizeof(float);
    if (bytes > size) __builtin_trap();
  } catch (const ringzero::Error&) {
    // the expected outcome for malformed input
  }
  return 0;
}
