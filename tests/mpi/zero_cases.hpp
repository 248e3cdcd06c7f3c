// The cases chapters 06 and 07 share in their MPI tests (tests/mpi/zero1.cpp, zero2.cpp):
// the models, and the bitwise check of a ZeRO lesson against chapter 05's DDP.
// Self-contained: includes what it uses, in any order.
#pragma once

#include <catch2/catch.hpp>

#include <span>
#include <string>
#include <utility>
#include <vector>

#include "mpi/difference_report.hpp"
#include "mpi/test_comm.hpp"
#include "mpi/zero_harness.hpp"

namespace ringzero::test {

// {sizes, bucket_cap_mb}: the MLP's shape with odd widths; a hidden layer of 1 (a bias of one
// element, fewer than ranks); 3; tiny caps so that every parameter is its own bucket; and
// layers large enough for Eigen's blocked GEMM (rows + cols + depth >= 20) in several buckets;
// whole models with fewer elements than ranks (Ψ = 2 and 3: ranks that own only padding).
inline const std::vector<std::pair<std::vector<int64_t>, double>> kModels = {
    {{7, 5, 3}, 25.0}, {{7, 5, 3}, 1e-6},    {{6, 1, 3}, 1e-6},
    {{6, 3, 2}, 1e-6}, {{9, 4, 4, 2}, 1e-4}, {{45, 31, 7}, 2e-3},
    {{1, 1}, 25.0},    {{2, 1}, 1e-6}};  // last two: Ψ < N

/// Every model with K in {1, 3}: after one backward and finalize_backward(), before any step,
/// this rank's reduced gradient shard of every bucket equals chapter 05's DDP's averaged
/// gradient at the same elements, bit for bit. Checked before the optimizer on purpose: AdamW's
/// m/√v is scale-free, so a shard that is the SUM rather than the mean changes the parameters
/// by an ulp only; here it reads "every differing element is got = 3 × expected" at N = 3.
/// E: the chapter's engine (Zero1<>, Zero2<>).
template <class E>
void require_gradient_shards_equal_to_ddp() {
  Communicator& comm = test_comm();
  const int N = comm.world_size(), r = comm.rank();
  for (const auto& [sizes, cap] : kModels) {
    for (int64_t K : {1, 3}) {
      ZeroCase c;
      c.sizes = sizes;
      c.grad_accum_steps = K;
      INFO("sizes[1] = " << sizes[1] << ", cap " << cap << " MiB, K = " << K << ", N = " << N
                         << ", rank " << r);
      const TrainConfig config = zero_test_config(c);
      RunResult unused;
      Model ddp_model(sizes, /*seed=*/5), zero_model(sizes, /*seed=*/5);
      DDP::Options ddp_options;
      ddp_options.bucket_cap_mb = cap;
      DDP ddp(comm, ddp_model, config, ddp_options);
      ddp.zero_grad();
      zero_test_backward(c, ddp_model, ddp, r, 0, unused);
      ZeroOptions options;
      options.bucket_cap_mb = cap;
      E zero(comm, zero_model, config, options);
      zero.zero_grad();
      zero_test_backward(c, zero_model, zero, r, 0, unused);
      const std::span<const float> mean = ddp_model.grads_memory.span();
      std::vector<double> compared = {0.0};  // real elements compared, summed over ranks: Ψ
      for (size_t b = 0; b < zero.layout().buckets.size(); ++b) {
        const BucketShard& s = zero.layout().buckets[b];
        // Rank r's real elements of bucket b are [r s, r s + real) of its unpadded elements.
        const int64_t first = s.offset + r * s.shard_size;
        REQUIRE_SAME_BITS("the reduced gradient shard of bucket " + std::to_string(b) +
                              " after backward, before the step (expected: the mean over ranks, "
                              "chapter 05's DDP's gradient)",
                          mean.subspan(first, s.real), zero.shard_grads(b), [&](size_t j) {
                            return "element " + std::to_string(r * s.shard_size + j) +
                                   " of the bucket's " + std::to_string(s.size);
                          });
        compared[0] += static_cast<double>(s.real);
      }
      comm.all_reduce_metrics(compared);
      REQUIRE(compared[0] == static_cast<double>(zero_model.num_parameters()));
    }
  }
}

/// Every model with K in {1, 3} and clipping off/on: parameters, losses and AdamW state
/// (exp_avg, exp_avg_sq, per-parameter step) bit for bit equal to chapter 05's DDP with one
/// unsharded optimizer, and the padding exactly zero. L: the chapter's lesson (Zero1Training).
template <class L>
void require_bitwise_equal_to_ddp() {
  for (const auto& [sizes, cap] : kModels) {
    for (int64_t K : {1, 3}) {
      for (float clip : {0.0f, 0.05f}) {
        ZeroCase c;
        c.sizes = sizes;
        c.bucket_cap_mb = cap;
        c.grad_accum_steps = K;
        c.clip_grad_norm = clip;
        INFO("sizes[1] = " << sizes[1] << ", cap " << cap << " MiB, K = " << K << ", clip " << clip
                           << ", N = " << test_comm().world_size() << ", rank "
                           << test_comm().rank());
        const RunResult ddp = run_ddp_reference(c), zero = run_zero<L>(c);
        const Model names(sizes, 1);  // element i of the flat parameters: its name, bucket, shard
        const auto buckets = plan_buckets(parameter_sizes(names), mib_to_bytes(cap),
                                          mib_to_bytes(DDP::Options{}.first_bucket_cap_mb));
        // Step by step, and the first step that differs is the one reported: after a later
        // step one wrong element has spread (the next forward, AdamW's moments), so the first
        // element that differs there is often a consequence, not the wrong chunk itself.
        REQUIRE(ddp.step_params.size() == static_cast<size_t>(c.steps));
        REQUIRE(zero.step_params.size() == static_cast<size_t>(c.steps));
        REQUIRE(zero.losses.size() == ddp.losses.size());
        for (int64_t s = 0; s < c.steps; ++s) {
          const std::string at = " of step " + std::to_string(s + 1) + " of " +
                                 std::to_string(c.steps) +
                                 (s == 0 ? "" : " (the steps before it are equal)");
          // The loss of step s + 1 is computed from the parameters after step s.
          REQUIRE_SAME_BITS("the loss" + at + " (expected: chapter 05's DDP's)",
                            std::span(ddp.losses).subspan(s, 1),
                            std::span(zero.losses).subspan(s, 1), {});
          REQUIRE_SAME_BITS("the parameters at the end" + at + " (expected: chapter 05's DDP's)",
                            ddp.step_params[s], zero.step_params[s],
                            bucket_element(names, buckets, test_comm().world_size()));
        }
        {
          INFO(
              "padding elements that are not exactly 0 after a step, summed over the steps on "
              "this rank (the padding after each bucket's real elements must stay 0; the "
              "optimizer must never see it)");
          REQUIRE(zero.nonzero_padding == 0);
        }
        REQUIRE(zero.optimizer.size() == ddp.optimizer.size());
        for (const auto& [name, t] : ddp.optimizer) {
          INFO(name);
          REQUIRE(zero.optimizer.count(name) == 1);
          REQUIRE(zero.optimizer.at(name).shape == t.shape);
          REQUIRE_SAME_BITS("the AdamW state " + name + " (expected: chapter 05's DDP's)", t.values,
                            zero.optimizer.at(name).values,
                            [&name](size_t j) { return name + "[" + std::to_string(j) + "]"; });
        }
        REQUIRE(zero.optimizer.at("0.weight.step").values[0] == static_cast<float>(c.steps));
      }
    }
  }
}

}  // namespace ringzero::test
