// bucket_tools: what the driver does around a bucket plan (chapter 05's buckets.hpp, used by
// DDP, ZeRO-1 and ZeRO-2), written once: the bucket flags and their check (--bucket-cap-mb,
// --first-bucket-cap-mb, --find-unused-parameters), the --explain-buckets table, and the
// start-up check that every rank cut the same plan.
// Leaves out: how the plan is cut (buckets.hpp: the lesson). A plan is a std::vector of
// buckets with `offset`, `size` (elements) and `params` (parameter indices).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common/comm/comm.hpp"
#include "common/core/check.hpp"
#include "common/core/nn.hpp"
#include "common/driver/lesson.hpp"
#include "common/report/metrics.hpp"

namespace ringzero {

/// Whether `mib` is a bucket cap mib_to_bytes takes (kBucketCapRange says which).
inline bool is_bucket_cap(double mib) {
  return std::isfinite(mib) && mib * 1024.0 * 1024.0 >= 1.0 && mib <= 1024.0 * 1024.0;
}
inline constexpr const char* kBucketCapRange =
    "a finite size from 1 byte (9.6e-07) to 1 TiB (1048576); PyTorch's default is 25";

/// MiB, as PyTorch's bucket_cap_mb (bucket_bytes_cap = int(bucket_cap_mb * 1024 * 1024)).
inline int64_t mib_to_bytes(double mib) {
  // Checked here, in MiB, so the message shows what the user typed (a NaN or 1e30 would
  // otherwise reach the int64 conversion, which is undefined behaviour).
  RZ_CHECK(is_bucket_cap(mib),
           "--bucket-cap-mb / --first-bucket-cap-mb " << mib << " must be " << kBucketCapRange);
  return static_cast<int64_t>(mib * 1024.0 * 1024.0);
}

/// The check of --bucket-cap-mb and --first-bucket-cap-mb when the flags are read, so the
/// error names the flag (mib_to_bytes, later, cannot tell which of the two it was given).
inline CLI::Validator bucket_cap_size() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        double mib = 0;  // converted as CLI11 converts the option's value ("1e400": inf)
        if (value.empty()) return "an empty value is not a size in MiB; PyTorch's default is 25";
        if (!CLI::detail::lexical_cast(value, mib)) return "";  // the option's conversion says
        return is_bucket_cap(mib) ? "" : value + " MiB is not " + kBucketCapRange;
      },
      "MiB");
}

/// Registers the bucket flags DDP and ZeRO-1/2 share, into `options` (an engine's Options:
/// bucket_cap_mb, first_bucket_cap_mb, find_unused_parameters), and --explain-buckets into
/// `explain`. The caps are left out of the start-up flag check: check_bucket_plans_match()
/// reports a mismatch by the plan it changes.
template <class Options>
void add_bucket_flags(CommandLine& cli, Options& options, bool& explain) {
  cli.app
      .add_option("--bucket-cap-mb", options.bucket_cap_mb,
                  "bucket size limit in MiB (PyTorch's default: 25)")
      ->check(bucket_cap_size());
  cli.app
      .add_option("--first-bucket-cap-mb", options.first_bucket_cap_mb,
                  "the first bucket's limit in MiB (1)")
      ->check(bucket_cap_size());
  cli.app.add_flag("--find-unused-parameters", options.find_unused_parameters,
                   "count a parameter that gets no gradient as a zero gradient instead of failing");
  cli.checked_elsewhere.insert(cli.checked_elsewhere.end(),
                               {"bucket-cap-mb", "first-bucket-cap-mb"});
  cli.app.add_flag("--explain-buckets", explain,
                   "print the bucket plan (buckets, parameters, elements, bytes)");
}

/// The --explain-buckets table: one line per bucket, in the order of the collectives, which
/// `collective` names ("all-reduced" in chapter 05, "reduce-scattered" in 06-07).
template <class BucketType>
std::string explain_buckets(const std::vector<BucketType>& plan, const Model& model,
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
template <class BucketType>
void check_bucket_plans_match(Communicator& comm, const std::vector<BucketType>& plan) {
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

}  // namespace ringzero
