// ZeRO-1 (chapters/06_zero1: shard.hpp, zero.hpp) under mpirun, np 1..4:
//  - the padded layout: pad = (N − n mod N) mod N per bucket, equal shards, every real element
//    owned by exactly one rank, segments that tile each rank's real elements;
//  - bit for bit the same parameters, losses and AdamW state (exp_avg, exp_avg_sq, per-parameter
//    step) as chapter 05's DDP with one unsharded optimizer, for models whose sizes do not
//    divide by N, a layer with fewer elements than ranks, one bucket per parameter,
//    accumulation K > 1 with no_sync, and clipping that is active;
//  - the padding stays exactly zero;
//  - the ledger: model states per rank = 4Ψ + 4Ψ + 8·(this rank's real shard) + 8·padding.
#include <numeric>

#include <catch2/catch.hpp>

#include "chapters/06_zero1/step.hpp"
#include "mpi/zero_cases.hpp"
#include "mpi/zero_harness.hpp"

using namespace ringzero;
using namespace ringzero::test;

TEST_CASE("the padded layout: equal shards, every real element owned once", "[zero1]") {
  Communicator& comm = test_comm();
  const int N = comm.world_size(), r = comm.rank();
  for (const auto& [sizes, cap] : kModels) {
    Model model(sizes, 1);
    const auto plan = plan_buckets(parameter_sizes(model), mib_to_bytes(cap), mib_to_bytes(1.0));
    const ShardLayout layout = plan_shards(model, plan, r, N);
    INFO("model of " << model.num_parameters() << " parameters, " << plan.size()
                     << " buckets, N = " << N);
    int64_t padded = 0;
    std::vector<double> owned(plan.size(),
                              0.0);  // (buckets) real elements owned, summed over ranks
    for (size_t b = 0; b < plan.size(); ++b) {
      const BucketShard& s = layout.buckets[b];
      REQUIRE(s.padding == (N - s.size % N) % N);
      REQUIRE(s.padded_size() % N == 0);
      REQUIRE(s.shard_size == ring_chunk(s.padded_size(), N, r).size);  // the ring's chunk, exactly
      REQUIRE(s.shard_size == ring_chunk(s.size, N, 0).size);  // = ceil(n / N): same chunks as DDP
      REQUIRE(std::accumulate(s.segments.begin(), s.segments.end(), int64_t{0}) == s.real);
      owned[b] = static_cast<double>(s.real);
      padded += s.padded_size();
    }
    REQUIRE(padded == layout.padded_total);
    REQUIRE(layout.padded_total == model.num_parameters() + layout.padding_total);
    REQUIRE(layout.shard_total * N == layout.padded_total);
    for (size_t i = 0; i < model.parameters().size();
         ++i) {  // parameters keep their order, no overlap
      if (i > 0)
        REQUIRE(layout.param_offset[i] >=
                layout.param_offset[i - 1] + model.parameters()[i - 1]->numel());
      REQUIRE(layout.param_offset[i] + model.parameters()[i]->numel() <= layout.padded_total);
    }
    comm.all_reduce_metrics(owned);
    for (size_t b = 0; b < plan.size(); ++b) REQUIRE(owned[b] == static_cast<double>(plan[b].size));
  }
}

TEST_CASE("ZeRO-1's reduced gradient shard is the mean over ranks: chapter 05's gradient",
          "[zero1]") {
  require_gradient_shards_equal_to_ddp<Zero1<>>();
}

TEST_CASE("ZeRO-1 equals chapter 05's DDP bit for bit: parameters, losses, AdamW state",
          "[zero1]") {
  require_bitwise_equal_to_ddp<Zero1Training<>>();
}

TEST_CASE("the ledger: model states 4Ψ + 4Ψ + 8·shard + 8·padding per rank", "[zero1]") {
  Communicator& comm = test_comm();
  for (const auto& [sizes, cap] : kModels) {
    Model model(sizes, 1);
    const int64_t psi = model.num_parameters();
    const Ledger& ledger = Ledger::get();
    const int64_t before = ledger.model_states_current(),
                  params_before = ledger.current(MemTag::parameters),
                  padding_before = ledger.current(MemTag::padding),
                  grads_before = ledger.current(MemTag::gradients);
    ZeroCase c;
    c.sizes = sizes;
    ZeroOptions options;
    options.bucket_cap_mb = cap;
    Zero1<> zero(comm, model, zero_test_config(c), options);
    const ShardLayout& layout = zero.layout();
    INFO("Ψ = " << psi << ", padding " << layout.padding_total << ", shard " << layout.shard_real);
    REQUIRE(ledger.current(MemTag::parameters) == params_before);  // moved, not copied
    REQUIRE(ledger.current(MemTag::gradients) == grads_before);
    REQUIRE(ledger.current(MemTag::padding) - padding_before == 8 * layout.padding_total);
    // Model states before: the model's 4Ψ + 4Ψ. After: the same, AdamW's 8 bytes per real shard
    // element, and the padding of the parameters and of the gradients.
    REQUIRE(ledger.model_states_current() - before ==
            8 * layout.shard_real + 8 * layout.padding_total);
    REQUIRE(ledger.model_states_current() - before + 8 * psi ==
            zero.model_states_bytes()[comm.rank()]);  // printed
    std::vector<double> real = {static_cast<double>(layout.shard_real)};
    comm.all_reduce_metrics(real);
    REQUIRE(real[0] == static_cast<double>(psi));      // Σ over ranks: each state element once
    REQUIRE(layout.shard_real <= layout.shard_total);  // ≤ (Ψ + padding)/N
  }
}
