// ZeRO-2 (chapters/07_zero2/zero.hpp) under mpirun, np 1..4:
//  - bit for bit the same parameters, losses and AdamW state (exp_avg, exp_avg_sq, per-parameter
//    step) as chapter 05's DDP with one unsharded optimizer (and so as chapter 06, tested the
//    same way), for models whose sizes do not divide by N, a layer with fewer elements than
//    ranks, one bucket per parameter, accumulation K > 1 with no_sync, active clipping;
//  - the padding of the parameters and of the gradient shard stays exactly zero;
//  - the ledger: between steps the gradients are this rank's shard only, model states
//    4(Ψ + padding) + 4·shard + 8·(real shard); during a step with K = 1 the peak is that plus
//    exactly two consecutive buckets at most (buckets_in_flight_bytes()); with K > 1, plus every
//    bucket (no_sync accumulates full gradients, as DDP does).
#include "chapters/07_zero2/zero.hpp"
#include "mpi/zero_harness.hpp"

#undef CHECK
#include <catch2/catch.hpp>

using namespace ringzero;
using namespace ringzero::test;

namespace {
// As tests/mpi/zero1.cpp: odd sizes, a hidden layer of 1, tiny caps, Eigen's blocked GEMM sizes,
// whole models smaller than N.
const std::vector<std::pair<std::vector<int64_t>, double>> kModels = {
    {{7, 5, 3}, 25.0}, {{7, 5, 3}, 1e-6}, {{6, 1, 3}, 1e-6},     {{6, 3, 2}, 1e-6},
    {{9, 4, 4, 2}, 1e-4}, {{45, 31, 7}, 2e-3}, {{1, 1}, 25.0}, {{2, 1}, 1e-6}};  // last two: Ψ < N
}  // namespace

TEST_CASE("ZeRO-2 equals chapter 05's DDP bit for bit: parameters, losses, AdamW state", "[zero2]") {
  for (const auto& [sizes, cap] : kModels) {
    for (int64_t K : {1, 3}) {
      for (float clip : {0.0f, 0.05f}) {
        ZeroCase c;
        c.sizes = sizes;
        c.bucket_cap_mb = cap;
        c.grad_accum_steps = K;
        c.clip_grad_norm = clip;
        INFO("sizes[1] = " << sizes[1] << ", cap " << cap << " MiB, K = " << K << ", clip " << clip
                           << ", N = " << test_comm().world_size() << ", rank " << test_comm().rank());
        const RunResult ddp = run_ddp_reference(c), zero = run_zero(c);
        REQUIRE(bit_differences(ddp.params, zero.params) == 0);
        REQUIRE(bit_differences(ddp.losses, zero.losses) == 0);
        REQUIRE(zero.nonzero_padding == 0);
        REQUIRE(zero.optimizer.size() == ddp.optimizer.size());
        for (const auto& [name, t] : ddp.optimizer) {
          INFO(name);
          REQUIRE(zero.optimizer.count(name) == 1);
          REQUIRE(bit_differences(zero.optimizer.at(name).values, t.values) == 0);
        }
      }
    }
  }
}

TEST_CASE("the ledger: gradients are the shard between steps, two buckets at most in flight", "[zero2]") {
  Communicator& comm = test_comm();
  for (const auto& [sizes, cap] : kModels) {
    for (int64_t K : {1, 2}) {
      Model model(sizes, 1);
      const int64_t psi = model.num_parameters();
      Ledger& ledger = Ledger::get();
      const int64_t before = ledger.model_states_current(), grads_before = ledger.current(MemTag::gradients);
      ZeroCase c;
      c.sizes = sizes;
      c.grad_accum_steps = K;
      c.steps = 1;
      ZeRO::Options options;
      options.bucket_cap_mb = cap;
      ZeRO zero(comm, model, zero_test_config(c), options);
      const ShardLayout& layout = zero.layout();
      INFO("Ψ = " << psi << ", " << layout.buckets.size() << " buckets, K = " << K << ", N = " << comm.world_size());
      // The model's 4Ψ of gradients are gone; this rank's shard (real part) came instead.
      REQUIRE(ledger.current(MemTag::gradients) - grads_before == 4 * layout.shard_real - 4 * psi);
      const int64_t steady = ledger.model_states_current() - before + 8 * psi;
      REQUIRE(steady == zero.model_states_bytes()[comm.rank()]);
      REQUIRE(steady == 4 * layout.padded_total + 4 * layout.shard_total + 8 * layout.shard_real);

      ledger.reset_peaks();
      RunResult out;
      zero.zero_grad();
      zero_test_backward(c, model, zero, comm.rank(), 0, out);
      zero.step();
      REQUIRE(ledger.model_states_current() - before + 8 * psi == steady);  // buckets freed after the step
      // The step's peak above the steady state: the buckets alive at once.
      const int64_t peak_extra = ledger.model_states_peak() - ledger.model_states_current();
      REQUIRE(peak_extra == (K == 1 ? zero.buckets_in_flight_bytes() : 4 * layout.padded_total));
    }
  }
}
