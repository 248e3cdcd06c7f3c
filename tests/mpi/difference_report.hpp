// Where two float arrays differ, said so that a student can act on it: the coursework graders of
// chapters 05-08 (scripts/exercise check, docs/exercises.md) are these MPI tests, and a bare
// "REQUIRE( 21 == 0 )" names neither the rank, nor the element, nor the values (issue 11,
// item 2: "which rank, which chunk or element, expected vs got, which invariant broke").
// Self-contained: includes what it uses, in any order.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <functional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "common/core/nn.hpp"
#include "mpi/test_comm.hpp"

namespace ringzero::test {

/// Names element i of a flat array, e.g. "2.weight[17] (bucket 1, chunk of rank 2)".
using ElementName = std::function<std::string(size_t)>;

/// Element i of an array laid out as the model's parameters in registration order (the
/// model's grads_memory / params_memory, unpadded): "<param>[j]", plus `more(param, i)` if given.
inline ElementName parameter_element(const Model& model,
                                     std::function<std::string(size_t, size_t)> more = {}) {
  std::vector<std::string> names;
  for (const Parameter* p : model.parameters()) names.push_back(p->name());
  std::vector<int64_t> offsets = model.offsets();
  offsets.push_back(model.num_parameters());
  return [names, offsets, more](size_t i) {
    size_t p = 0;
    while (p + 1 < names.size() && static_cast<int64_t>(i) >= offsets[p + 1]) ++p;
    std::string s = names[p] + "[" + std::to_string(static_cast<int64_t>(i) - offsets[p]) + "]";
    if (more) s += more(p, i);
    return s;
  };
}

/// Element i of the model's flat gradients or parameters, also naming its bucket and the ring
/// chunk (for ZeRO: the rank whose shard) it falls in: chunk c = [c·ceil(n/N), (c+1)·ceil(n/N))
/// of a bucket of n elements. B: anything with `offset` and `size` in elements (chapter 05's
/// Bucket, chapter 06's BucketShard).
template <class B>
ElementName bucket_element(const Model& model, const std::vector<B>& buckets, int world_size) {
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const B& b : buckets) ranges.emplace_back(b.offset, b.size);
  return parameter_element(model, [ranges, world_size](size_t, size_t i) -> std::string {
    for (size_t b = 0; b < ranges.size(); ++b) {
      const int64_t j = static_cast<int64_t>(i) - ranges[b].first, n = ranges[b].second;
      if (j < 0 || j >= n) continue;
      const int64_t chunk = (n + world_size - 1) / world_size;
      return ", bucket " + std::to_string(b) + " element " + std::to_string(j) + " of " +
             std::to_string(n) + ", ring chunk " + std::to_string(j / chunk);
    }
    return "";
  });
}

/// "" when `got` equals `expected` bit for bit. Otherwise one paragraph for this rank:
///   rank 1 of 3: 58 of 140 elements of <what> differ (elements 12..139); first at element 38
///   = 2.weight[3], bucket 1 element 3 of 40, ring chunk 0: expected 0.0123457 got
///   0.00411523; every differing element is got = 0.333333 × expected
/// The closing pattern is reported only when it holds for every differing element: a constant
/// ratio, all zeros, or not-a-number.
inline std::string difference_report(std::string_view what, std::span<const float> expected,
                                     std::span<const float> got, const ElementName& name = {}) {
  const Communicator& comm = test_comm();
  std::ostringstream out;
  out.precision(7);
  out << "rank " << comm.rank() << " of " << comm.world_size() << ": ";
  if (expected.size() != got.size()) {
    out << what << " has " << got.size() << " elements, expected " << expected.size();
    return out.str();
  }
  size_t n = 0, first = 0, last = 0;
  bool zeros = true, nans = true, same_ratio = true;
  double ratio = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &expected[i], sizeof(float)) == 0) continue;
    if (n == 0) first = i;
    last = i;
    ++n;
    zeros = zeros && got[i] == 0.0f;
    nans = nans && std::isnan(got[i]);
    const double r = expected[i] != 0.0f ? static_cast<double>(got[i]) / expected[i] : NAN;
    if (n == 1) ratio = r;
    same_ratio = same_ratio && std::isfinite(r) && std::abs(r - ratio) <= 1e-4 * std::abs(ratio);
  }
  if (n == 0) return "";
  out << n << " of " << got.size() << " elements of " << what << " differ";
  if (n > 1) out << " (elements " << first << ".." << last << ")";
  out << "; first at element " << first << (name ? " = " + name(first) : std::string())
      << ": expected " << expected[first] << " got " << got[first];
  if (nans)
    out << "; every differing element is NaN";
  else if (zeros)
    out << "; every differing element is 0 (never written?)";
  else if (same_ratio && n > 1)
    out << "; every differing element is got = " << ratio << " × expected";
  return out.str();
}

}  // namespace ringzero::test

/// Fails the test with difference_report(...) unless `got` equals `expected` bit for bit.
#define REQUIRE_SAME_BITS(what, expected, got, name)                                \
  do {                                                                              \
    const std::string rz_report_ = ::ringzero::test::difference_report(             \
        what, std::span<const float>(expected), std::span<const float>(got), name); \
    if (!rz_report_.empty()) FAIL(rz_report_);                                      \
  } while (0)
