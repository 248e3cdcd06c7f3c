// with_precision: the element types of a run, chosen once from the flags (llm.c's floatX), for
// the engines written over them (chapters 06-08, common/precision/shard_precision.hpp).
// Leaves out: the engines; chapters 01-05 pick at run time (common/precision/precision.hpp).
#pragma once

#include "common/core/check.hpp"
#include "common/core/half.hpp"
#include "common/driver/config.hpp"

namespace ringzero {

/// Calls f.template operator()<T, R>() with T the element type of --precision and R that of
/// --reduce-dtype (default T): (float, float), (bf16, bf16), (bf16, float), (fp16, fp16) or
/// (fp16, float), the pairs PrecisionCheck admits before set-up (common/driver/run.cpp), and
/// returns what it returns. Errors: another pair (the message names both flags and the fix).
template <class F>
decltype(auto) with_precision(const TrainConfig& config, F&& f) {
  const Dtype p = parse_dtype(config.precision, "--precision");
  const Dtype r =
      config.reduce_dtype.empty() ? p : parse_dtype(config.reduce_dtype, "--reduce-dtype");
  if (p == Dtype::fp32 && r == Dtype::fp32) return f.template operator()<float, float>();
  if (p == Dtype::bf16 && r == Dtype::bf16) return f.template operator()<bf16, bf16>();
  if (p == Dtype::bf16 && r == Dtype::fp32) return f.template operator()<bf16, float>();
  if (p == Dtype::fp16 && r == Dtype::fp16) return f.template operator()<fp16, fp16>();
  RZ_CHECK(p == Dtype::fp16 && r == Dtype::fp32,
           "--reduce-dtype " << dtype_name(r) << " with --precision " << dtype_name(p)
                             << ": gradients are summed in the parameters' dtype or in fp32; use "
                                "--reduce-dtype "
                             << dtype_name(p) << " or fp32");
  return f.template operator()<fp16, float>();
}

}  // namespace ringzero

/// Explicit instantiations of an engine template `Engine<T, R>` for the five (T, R) pairs
/// with_precision builds, written once here; used in the one .cpp that defines an engine's
/// out-of-line members (chapter 08's zero_io.cpp for Zero3).
#define RINGZERO_INSTANTIATE_PRECISIONS(Engine) \
  template class Engine<float, float>;          \
  template class Engine<bf16, bf16>;            \
  template class Engine<bf16, float>;           \
  template class Engine<fp16, fp16>;            \
  template class Engine<fp16, float>
