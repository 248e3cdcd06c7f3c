// Gradient buckets: which gradients are all-reduced together, and in which order.
//
// Backward produces gradients from the last layer to the first, so parameters are taken in
// REVERSE registration order and cut into buckets of about bucket_cap_mb; bucket 0 is the
// first to be complete and the first to be all-reduced, while backward is still busy with
// the earlier layers. Because the model keeps every gradient in one flat buffer in
// registration order (Model::grads_memory), parameters that are consecutive in reverse order
// are also consecutive in memory: a bucket is just an (offset, size) range of grads_memory.
// The gradients ARE the bucket (PyTorch's gradient_as_bucket_view=True): nothing is copied
// into a bucket before the all-reduce, nor out of it afterwards.
//
// The cut follows PyTorch's compute_bucket_assignment_by_size (torch/csrc/distributed/c10d/
// reducer.cpp) with the size limits [first_bucket_cap, bucket_cap]: parameters are added
// in order, and a bucket is closed as soon as it reaches its limit (so it may pass the limit
// by part of its last parameter). The first bucket's limit is smaller (PyTorch's
// dist._DEFAULT_FIRST_BUCKET_BYTES = 1 MiB) so that the first all-reduce starts early. Two
// differences, both deliberate: a parameter larger than bucket_cap never joins a bucket that
// already holds others (it gets its own bucket), and the first limit is min(1 MiB, cap), so
// that a small --bucket-cap-mb really gives small buckets.
// (PyTorch's first iteration buckets in registration order and reverses the list, which puts
// the small bucket LAST; after one iteration it rebuilds the buckets in the order gradients
// actually arrived, which gives the plan below. Our order of arrival is known in advance.)
//
// Every rank must cut the same buckets, or the ranks would pair up all-reduces of different
// sizes: check_bucket_plans_match() (common/driver/bucket_tools.hpp, with the bucket flags and the
// --explain-buckets table) verifies that at start-up.
// Leaves out: rebuilding buckets from the observed order, dtypes other than float32.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "common/core/check.hpp"
#include "common/driver/bucket_tools.hpp"  // the flags, --explain-buckets, the plans-match check

namespace ringzero {

/// One bucket: elements [offset, offset + size) of grads_memory, holding the gradients of
/// `params` (parameter indices, in reverse registration order).
struct Bucket {
  int64_t offset = 0;
  int64_t size = 0;
  std::vector<int> params;
  bool operator==(const Bucket&) const = default;
};

/// The buckets for parameters of `param_sizes` elements (registration order), in the order
/// they are all-reduced. Limits in bytes of float32: the first bucket closes at
/// min(first_bucket_cap_bytes, bucket_cap_bytes), the others at bucket_cap_bytes.
/// Errors: a non-positive limit, a parameter with no elements.
inline std::vector<Bucket> plan_buckets(std::span<const int64_t> param_sizes,
                                        int64_t bucket_cap_bytes, int64_t first_bucket_cap_bytes) {
  RZ_CHECK(bucket_cap_bytes > 0 && first_bucket_cap_bytes > 0,
           "bucket caps must be positive (got " << bucket_cap_bytes << " and "
                                                << first_bucket_cap_bytes
                                                << " bytes); use --bucket-cap-mb > 0");
  std::vector<int64_t> offsets(param_sizes.size() + 1, 0);  // (P + 1) element offsets
  for (size_t i = 0; i < param_sizes.size(); ++i) {
    RZ_CHECK(param_sizes[i] > 0, "parameter " << i << " has " << param_sizes[i] << " elements");
    offsets[i + 1] = offsets[i] + param_sizes[i];
  }
  // BEGIN EXERCISE 05.1 (bucket assignment in reverse order)
  std::vector<Bucket> plan;
  Bucket current;
  int64_t limit = std::min(first_bucket_cap_bytes, bucket_cap_bytes);
  auto close = [&] {
    const int lowest = current.params.back();  // reverse order: the last one added is the lowest
    current.offset = offsets[lowest];
    current.size = offsets[current.params.front() + 1] - current.offset;
    plan.push_back(std::move(current));
    current = Bucket();
    limit = bucket_cap_bytes;
  };
  for (int i = static_cast<int>(param_sizes.size()) - 1; i >= 0; --i) {
    const int64_t bytes = 4 * param_sizes[i];
    if (!current.params.empty() && bytes > bucket_cap_bytes) close();  // too large to share
    current.params.push_back(i);
    if (4 * (offsets[current.params.front() + 1] - offsets[i]) >= limit) close();
  }
  if (!current.params.empty()) close();
  return plan;
  // END EXERCISE 05.1
}

/// Elements per bucket, in plan order.
inline std::vector<int64_t> bucket_sizes(const std::vector<Bucket>& plan) {
  std::vector<int64_t> sizes;
  for (const Bucket& b : plan) sizes.push_back(b.size);
  return sizes;
}

}  // namespace ringzero
