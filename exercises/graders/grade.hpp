// grade: the small reporting kit the coursework graders share (scripts/exercise check ID).
//
// A grader compares a student's function with a reference written independently (naive loops,
// float64) and, on a mismatch, says where and by how much: which rank, which chunk or element,
// expected vs got, and which invariant that breaks. It prints at most a few mismatches per
// check (the first ones tell the story) and exits non-zero when anything failed, so
// scripts/exercise and tests/exercises/prove_graders.sh can rely on the exit status.
// A starter stub (ringzero::exercise_stub) throws ringzero::Error; run_grader turns it into one
// clean line per rank and a non-zero exit, never a hang (MPI_Abort stops the other ranks).
// Leaves out: point values; the graders are pass/fail with feedback.
#pragma once

#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "common/core/check.hpp"

namespace grade {

/// Collects the mismatches of one grader run on this rank.
class Report {
 public:
  explicit Report(std::string exercise) : exercise_(std::move(exercise)) {}

  /// Records a failure unless |got - expected| <= atol + rtol |expected|. `where` names the
  /// element ("dweight[2, 3]", "chunk 2 element 9"), `invariant` what the value must satisfy.
  bool close(const std::string& where, double expected, double got, double atol, double rtol,
             const std::string& invariant) {
    ++checks_;
    const bool ok =
        std::isfinite(got) && std::abs(got - expected) <= atol + rtol * std::abs(expected);
    if (!ok) fail(where + ": expected " + num(expected) + ", got " + num(got) + " — " + invariant);
    return ok;
  }
  /// Records a failure unless got and expected are the same float, bit for bit.
  bool bitwise(const std::string& where, float expected, float got, const std::string& invariant) {
    ++checks_;
    const bool ok = expected == got || (std::isnan(expected) && std::isnan(got));
    if (!ok) fail(where + ": expected " + num(expected) + ", got " + num(got) + " — " + invariant);
    return ok;
  }
  /// Records a failure with a free-form message.
  void fail(const std::string& message) {
    if (++failures_ <= kMaxShown) lines_.push_back(message);
  }
  int failures() const { return failures_; }

  /// Prints this rank's failures (ranks in order), then one verdict line on rank 0. Returns
  /// the process exit status: 0 when no rank failed.
  int finish() {
    int rank = 0, size = 1, initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) {
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      MPI_Comm_size(MPI_COMM_WORLD, &size);
    }
    for (int r = 0; r < size; ++r) {
      if (r == rank) {
        for (const std::string& line : lines_)
          std::fprintf(stderr, "[rank %d/%d] %s\n", rank, size, line.c_str());
        if (failures_ > kMaxShown)
          std::fprintf(stderr, "[rank %d/%d] ... and %d more mismatches\n", rank, size,
                       failures_ - kMaxShown);
        std::fflush(stderr);
      }
      if (initialized) MPI_Barrier(MPI_COMM_WORLD);
    }
    int total = failures_;
    long long checks = checks_;
    if (initialized) {
      MPI_Allreduce(MPI_IN_PLACE, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
      MPI_Allreduce(MPI_IN_PLACE, &checks, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    }
    if (rank == 0) {
      if (total == 0)
        std::printf("PASS %s (%lld values checked on %d rank%s)\n", exercise_.c_str(), checks, size,
                    size == 1 ? "" : "s");
      else
        std::printf("FAIL %s: %d mismatches over %d rank%s (first ones above)\n", exercise_.c_str(),
                    total, size, size == 1 ? "" : "s");
      std::fflush(stdout);
    }
    return total == 0 ? 0 : 1;
  }

  static std::string num(double x) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.9g", x);
    return buf;
  }

 private:
  static constexpr int kMaxShown = 6;
  std::string exercise_;
  std::vector<std::string> lines_;
  int failures_ = 0;
  long long checks_ = 0;
};

/// A deterministic value for (rank, element) that is exact in float32 and different for every
/// pair, so a wrong sum, a missing rank or a misplaced element shows up in the value itself:
/// (rank + 1) * 1000 + element, for element < 1000 (small integers add exactly in float).
inline float tag_value(int rank, int64_t element) {
  return static_cast<float>((rank + 1) * 1000 + element % 1000);
}

/// A 16-bit test value: a small integer, exact in bf16 (8 significant bits), and so is every
/// partial sum over up to 4 ranks (at most 31 + 47 + 63 + 79 = 220 < 256).
inline float small_value(int rank, int64_t element) {
  return static_cast<float>((rank + 1) * 16 + element % 16);
}

/// Runs a grader body under ringzero::run_main: a stub's or a check's Error becomes one line
/// on stderr and MPI_Abort (exit 1 on every rank within seconds).
inline int run_grader(const std::function<int()>& body) {
  return ringzero::run_main(body);
}

}  // namespace grade
