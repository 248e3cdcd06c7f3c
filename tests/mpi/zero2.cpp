// ZeRO-2 (chapters/07_zero2/zero.hpp) under mpirun, np 1..4:
//  - bit for bit the same parameters, losses and AdamW state (exp_avg, exp_avg_sq, per-parameter
//    step) as chapter 05's DDP with one unsharded optimizer (and so as chapter 06, tested the
//    same way), for models whose sizes do not divide by N, a layer with fewer elements than
//    ranks, one bucket per parameter, accumulation K > 1 with no_sync, active clipping;
//  - the padding of the parameters and of the gradient shard stays exactly zero;
//  - the ledger: between steps the gradients are this rank's shard only, model states
//    4(Ψ + padding) + 4·shard + 8·(real shard); during a step with K = 1 the peak is that plus
//    exactly two consecutive buckets at most (describe().in_flight_peak_bytes); with K > 1, plus
//    every bucket (no_sync accumulates full gradients, as DDP does).
#include <catch2/catch.hpp>

#include "chapters/07_zero2/step.hpp"
#include "mpi/zero_cases.hpp"
#include "mpi/zero_harness.hpp"

using namespace ringzero;
using namespace ringzero::test;

TEST_CASE("ZeRO-2's reduced gradient shard is the mean over ranks: chapter 05's gradient",
          "[zero2]") {
  require_gradient_shards_equal_to_ddp<Zero2<>>();
}

TEST_CASE("ZeRO-2 equals chapter 05's DDP bit for bit: parameters, losses, AdamW state",
          "[zero2]") {
  require_bitwise_equal_to_ddp<Zero2Training<>>();
}

TEST_CASE("the ledger: gradients are the shard between steps, two buckets at most in flight",
          "[zero2]") {
  Communicator& comm = test_comm();
  for (const auto& [sizes, cap] : kModels) {
    for (int64_t K : {1, 2}) {
      Model model(sizes, 1);
      const int64_t psi = model.num_parameters();
      Ledger& ledger = Ledger::get();
      const int64_t before = ledger.model_states_current(),
                    grads_before = ledger.current(MemTag::gradients);
      ZeroCase c;
      c.sizes = sizes;
      c.grad_accum_steps = K;
      c.steps = 1;
      ZeroOptions options;
      options.bucket_cap_mb = cap;
      Zero2<> zero(comm, model, zero_test_config(c), options);
      const ShardLayout& layout = zero.layout();
      INFO("Ψ = " << psi << ", " << layout.buckets.size() << " buckets, K = " << K
                  << ", N = " << comm.world_size());
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
      REQUIRE(ledger.model_states_current() - before + 8 * psi ==
              steady);  // buckets freed after the step
      // The step's peak above the steady state: the buckets alive at once.
      const int64_t peak_extra = ledger.model_states_peak() - ledger.model_states_current();
      REQUIRE(peak_extra ==
              (K == 1 ? *zero.describe().in_flight_peak_bytes : 4 * layout.padded_total));
    }
  }
}
