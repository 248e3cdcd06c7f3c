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
// sizes: check_bucket_plans_match() verifies that at start-up.
// Leaves out: rebuilding buckets from the observed order, dtypes other than float32.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "common/check.hpp"
#include "common/comm.hpp"
#include "common/lesson.hpp"
#include "common/metrics.hpp"
#include "common/nn.hpp"

namespace ringzero {

/// One bucket: elements [offset, offset + size) of grads_memory, holding the gradients of
/// `params` (parameter indices, in reverse registration order).
struct Bucket {
  int64_t offset = 0;
  int64_t size = 0;
  std::vector<int> params;
  bool operator==(const Bucket&) const = default;
};

/// MiB, as PyTorch's bucket_cap_mb (bucket_bytes_cap = int(bucket_cap_mb * 1024 * 1024)).
inline int64_t mib_to_bytes(double mib) {
  // Checked here, in MiB, so the message shows what the user typed (a NaN or 1e30 would
  // otherwise reach the int64 conversion, which is undefined behaviour).
  RZ_CHECK(std::isfinite(mib) && mib * 1024.0 * 1024.0 >= 1.0 && mib <= 1024.0 * 1024.0,
           "--bucket-cap-mb / --first-bucket-cap-mb "
               << mib
               << " must be a finite size from 1 byte (9.6e-07) to 1 TiB "
                  "(1048576); PyTorch's default is 25");
  return static_cast<int64_t>(mib * 1024.0 * 1024.0);
}

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

/// The --explain-buckets table: one line per bucket, in the order of the collectives, which
/// `collective` names ("all-reduced" in chapter 05, "reduce-scattered" in 06-07).
inline std::string explain_buckets(const std::vector<Bucket>& plan, const Model& model,
                                   double bucket_cap_mb, double first_bucket_cap_mb,
                                   const char* collective = "all-reduced") {
  char line[512];
  std::snprintf(
      line, sizeof line,
      "bucket plan: %zu parameters in %zu buckets (--bucket-cap-mb %g, first bucket %g MiB), "
      "%s in this order:\n",
      model.parameters().size(), plan.size(), bucket_cap_mb,
      std::min(first_bucket_cap_mb, bucket_cap_mb), collective);
  std::string out = line;
  for (size_t b = 0; b < plan.size(); ++b) {
    std::string names;
    for (int p : plan[b].params)
      names += (names.empty() ? "" : ", ") + model.parameters()[p]->name();
    std::snprintf(line, sizeof line,
                  "  bucket %-3zu | %10lld elements | %9s | grads_memory[%lld, %lld) | %s\n", b,
                  static_cast<long long>(plan[b].size), human_bytes(4.0 * plan[b].size).c_str(),
                  static_cast<long long>(plan[b].offset),
                  static_cast<long long>(plan[b].offset + plan[b].size), names.c_str());
    out += line;
  }
  return out;
}

/// Collective, at start-up: every rank learns every rank's plan (bucket sizes and parameter
/// counts, two all_reduce_metrics calls) and, if they differ, every rank fails with the same
/// message showing rank 0's plan and the first differing rank's. Mismatched plans would pair
/// all-reduces of different lengths: a hang or garbage, never an error, so check first.
inline void check_bucket_plans_match(Communicator& comm, const std::vector<Bucket>& plan) {
  const int N = comm.world_size(), r = comm.rank();
  std::vector<double> counts(static_cast<size_t>(N), 0.0);  // (N) buckets per rank
  counts[r] = static_cast<double>(plan.size());
  comm.all_reduce_metrics(counts);
  const auto width = static_cast<size_t>(*std::max_element(counts.begin(), counts.end()));
  std::vector<double> all(static_cast<size_t>(N) * width * 2, 0.0);  // (N, B, 2) size, #params
  for (size_t b = 0; b < plan.size(); ++b) {
    all[(r * width + b) * 2] = static_cast<double>(plan[b].size);
    all[(r * width + b) * 2 + 1] = static_cast<double>(plan[b].params.size());
  }
  comm.all_reduce_metrics(all);
  auto describe = [&](int q) {
    std::string s = "rank " + std::to_string(q) + ": " +
                    std::to_string(static_cast<int64_t>(counts[q])) + " buckets [";
    for (size_t b = 0; b < static_cast<size_t>(counts[q]); ++b)
      s += (b ? ", " : "") + std::to_string(static_cast<int64_t>(all[(q * width + b) * 2])) +
           " elements/" + std::to_string(static_cast<int64_t>(all[(q * width + b) * 2 + 1])) +
           " params";
    return s + "]";
  };
  for (int q = 1; q < N; ++q) {
    const bool same =
        counts[q] == counts[0] &&
        std::equal(all.begin() + q * width * 2, all.begin() + (q + 1) * width * 2, all.begin());
    RZ_CHECK(same, "the bucket plans differ across ranks, so their all-reduces would not match: "
                       << describe(0) << "; " << describe(q)
                       << ". Every rank must run the same model with the same --bucket-cap-mb and "
                       << "--first-bucket-cap-mb: launch all ranks with the same command line");
  }
}

/// Registers the bucket flags DDP and ZeRO-1/2 share. The caps are left out of the start-up
/// flag check: check_bucket_plans_match() reports a mismatch by the plan it changes.
inline void add_bucket_flags(CommandLine& cli, double& bucket_cap_mb, double& first_bucket_cap_mb,
                             bool& find_unused_parameters) {
  cli.app.add_option("--bucket-cap-mb", bucket_cap_mb,
                     "bucket size limit in MiB (PyTorch's default: 25)");
  cli.app.add_option("--first-bucket-cap-mb", first_bucket_cap_mb,
                     "the first bucket's limit in MiB (1)");
  cli.app.add_flag("--find-unused-parameters", find_unused_parameters,
                   "count a parameter that gets no gradient as a zero gradient instead of failing");
  cli.checked_elsewhere.insert(cli.checked_elsewhere.end(),
                               {"bucket-cap-mb", "first-bucket-cap-mb"});
}

}  // namespace ringzero
