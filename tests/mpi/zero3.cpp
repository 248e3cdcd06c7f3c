// ZeRO-3 (chapters/08_zero3: layer_shard.hpp, zero3.hpp) under mpirun, np 1..4:
//  - the per-layer layout: shards of ceil(Ψ_l / N) (the ring's chunks), every real element
//    owned by exactly one rank, segments that tile each rank's real elements;
//  - bit for bit the same parameters, losses and AdamW state (exp_avg, exp_avg_sq, step) as an
//    unsharded reference that all-reduces each layer's gradient with chapter 04's ring after
//    every micro-step (the same chunks, so the same sums in the same order), for sizes that do
//    not divide by N, a layer with fewer elements than ranks, accumulation K > 1 and active
//    clipping; with and without prefetch, identical;
//  - the padding stays exactly zero;
//  - memory: model states 4Σs + 4Σs + 8·(real shard) at every moment of a step (never the
//    full 16Ψ), and the full layers in flight (comm_buffers) peak at in_flight_peak_bytes();
//  - traffic: the counters equal zero3_traffic_theory() exactly, and evaluation adds none;
//  - bf16: the first forward equals chapter 01's bf16 forward bit for bit, and no gathered layer
//    is left after a step;
//  - prefetch: the all-gather of layer l+1 (l−1 in backward) is posted before layer l's
//    compute ends, from the recorded events; without prefetch, only after.
#include <array>
#include <cstring>
#include <numeric>

#include "chapters/08_zero3/zero3.hpp"
#include "common/core/rng.hpp"
#include "common/driver/dist_eval.hpp"
#include "common/precision/precision.hpp"
#include "common/zero/shard_state.hpp"
#include "mpi/difference_report.hpp"
#include "mpi/test_comm.hpp"

#include <catch2/catch.hpp>

using namespace ringzero;

namespace {

struct Case {
  std::vector<int64_t> sizes;  // {in, hidden..., out}
  int64_t steps = 3;
  int64_t grad_accum_steps = 1;
  float clip_grad_norm = 0.0f;
  bool prefetch = true;
  int64_t micro_batch = 3;
};

// The MLP's shape with odd widths; a hidden layer of 1 (layers of 3 and 2 elements: fewer than
// ranks); widths that give Eigen's blocked GEMM; four layers of different sizes.
const std::vector<std::vector<int64_t>> kModels = {
    {7, 5, 3}, {2, 1, 1}, {6, 3, 2}, {45, 31, 7}, {9, 4, 6, 2, 3}};

// Calls f(c) for every model of kModels, with prefetch on and off.
template <class F>
void for_each_prefetch_case(F&& f) {
  for (bool prefetch : {true, false}) {
    for (const auto& sizes : kModels) {
      Case c;
      c.sizes = sizes;
      c.prefetch = prefetch;
      f(c);
    }
  }
}

struct Result {
  std::vector<float> params;                     // (Ψ) registration order
  std::vector<float> losses;                     // every micro-step's loss on this rank
  std::map<std::string, NamedTensor> optimizer;  // "<param>.exp_avg" / ".exp_avg_sq" / ".step"
  int64_t nonzero_padding = 0;
};

TrainConfig config_of(const Case& c) {
  TrainConfig config;
  config.optimizer = "adamw";
  config.lr = 1e-2f;  // large enough that every step moves every weight
  config.weight_decay = 0.1f;
  config.grad_accum_steps = c.grad_accum_steps;
  config.clip_grad_norm = c.clip_grad_norm;
  return config;
}

// Rank r's regression micro-batch at (step, micro_step): different on every rank.
Batch batch_of(const Case& c, int rank, int64_t step, int64_t micro_step) {
  Batch b;
  b.x = Tensor::zeros({c.micro_batch, c.sizes.front()}, MemTag::activations);
  b.y = Tensor::zeros({c.micro_batch, c.sizes.back()}, MemTag::activations);
  Rng rng(7, static_cast<uint64_t>(10000 * step + 100 * micro_step + rank));
  for (float& v : b.x.span()) v = rng.normal();
  for (float& v : b.y.span()) v = rng.normal();
  return b;
}

float micro_step(const Case& c, Model& model, int rank, int64_t step, int64_t k) {
  Batch batch = batch_of(c, rank, step, k);
  Tape tape;
  Var loss = forward_loss(tape, model, batch);
  tape.backward(loss, 1.0f / static_cast<float>(c.grad_accum_steps));
  return loss->value[0];
}

// Unsharded, what ZeRO-3 computes: after every micro-step each layer's gradient (weight and
// bias, contiguous) is ring-all-reduced, divided by N and added to an accumulator.
Result run_reference(const Case& c) {
  Communicator& comm = test_comm();
  const TrainConfig config = config_of(c);
  Model model(c.sizes, /*seed=*/5);
  Optimizer optimizer(config, parameter_sizes(model));
  const LayerLayout layout = plan_layer_shards(model, comm.rank(), comm.world_size());
  Buffer acc(model.num_parameters(), MemTag::gradients),
      scratch(model.num_parameters(), MemTag::comm_buffers);
  Result out;
  for (int64_t step = 0; step < c.steps; ++step) {
    std::fill(acc.data(), acc.data() + acc.size(), 0.0f);
    for (int64_t k = 0; k < c.grad_accum_steps; ++k) {
      model.zero_grad();
      out.losses.push_back(micro_step(c, model, comm.rank(), step, k));
      for (const BucketShard& s : layout.buckets) {
        std::span<float> g = model.grads_memory.span().subspan(s.offset, s.size);
        ring_all_reduce(comm, g, scratch.span());
        for (int64_t i = 0; i < s.size; ++i)
          acc.data()[s.offset + i] += g[i] / static_cast<float>(comm.world_size());
      }
    }
    if (c.clip_grad_norm > 0) clip_grad_norm(acc.span(), c.clip_grad_norm);
    optimizer.step(model.params_memory.span(), acc.span());
  }
  out.params.assign(model.params_memory.data(),
                    model.params_memory.data() + model.num_parameters());
  const AdamW& adamw = *optimizer.adamw();
  for (size_t i = 0; i < model.parameters().size(); ++i) {
    const Parameter& p = *model.parameters()[i];
    auto part = [&](std::span<const float> v) {
      return std::vector<float>(v.begin() + model.offsets()[i],
                                v.begin() + model.offsets()[i] + p.numel());
    };
    out.optimizer[p.name() + ".exp_avg"] = {p.shape(), part(adamw.exp_avg())};
    out.optimizer[p.name() + ".exp_avg_sq"] = {p.shape(), part(adamw.exp_avg_sq())};
    out.optimizer[p.name() + ".step"] = {{1}, {static_cast<float>(adamw.segment_steps()[i])}};
  }
  return out;
}

Result run_zero3(const Case& c, Tracer* tracer = nullptr) {
  Communicator& comm = test_comm();
  Model model(c.sizes, /*seed=*/5);
  Zero3Options options;
  options.prefetch = c.prefetch;
  options.tracer = tracer;
  Zero3<> zero(comm, model, config_of(c), options);
  if (tracer) trace_layers(*tracer, model);  // as EngineLesson: inside the engine's hooks
  Result out;
  for (int64_t step = 0; step < c.steps; ++step) {
    zero.zero_grad();
    for (int64_t k = 0; k < c.grad_accum_steps; ++k)
      out.losses.push_back(micro_step(c, model, comm.rank(), step, k));
    zero.finalize_backward();
    zero.step();  // --clip-grad-norm (config_of) first
    out.nonzero_padding += nonzero_padding(zero);
  }
  const auto state = sharded_model_state_dict(zero, model);
  for (const Parameter* p : model.parameters()) {
    const auto& v = state.at(p->name()).values;
    out.params.insert(out.params.end(), v.begin(), v.end());
  }
  out.optimizer = sharded_optimizer_state_dict(zero, model);
  return out;
}

// Element i of the flat parameters: its name, its layer and the rank whose shard holds it
// (layer l's shard c = elements [c·s_l, (c+1)·s_l) of its weight-then-bias).
test::ElementName layer_element(const std::vector<int64_t>& sizes) {
  const Model model(sizes, 1);
  const LayerLayout layout = plan_layer_shards(model, 0, test_comm().world_size());
  std::vector<std::array<int64_t, 3>> layers;  // offset, numel, shard size
  for (const BucketShard& s : layout.buckets) layers.push_back({s.offset, s.size, s.shard_size});
  return test::parameter_element(model, [layers](size_t, size_t i) -> std::string {
    for (size_t l = 0; l < layers.size(); ++l) {
      const int64_t j = static_cast<int64_t>(i) - layers[l][0];
      if (j >= 0 && j < layers[l][1])
        return ", layer " + std::to_string(l) + " element " + std::to_string(j) + " of " +
               std::to_string(layers[l][1]) + ", in rank " + std::to_string(j / layers[l][2]) +
               "'s shard";
    }
    return "";
  });
}

// `got` equals `expected` bit for bit: parameters, every micro-step's loss, AdamW's state.
void require_same(const Case& c, std::string_view expected_from, const Result& expected,
                  const Result& got) {
  const std::string of = " (expected: " + std::string(expected_from) + ")";
  REQUIRE_SAME_BITS("the parameters after " + std::to_string(c.steps) + " steps" + of,
                    expected.params, got.params, layer_element(c.sizes));
  REQUIRE_SAME_BITS("the losses, one per micro-step" + of, expected.losses, got.losses, {});
  REQUIRE(got.optimizer.size() == expected.optimizer.size());
  for (const auto& [name, t] : expected.optimizer) {
    INFO(name);
    REQUIRE(got.optimizer.count(name) == 1);
    REQUIRE(got.optimizer.at(name).shape == t.shape);
    REQUIRE_SAME_BITS("the AdamW state " + name + of, t.values, got.optimizer.at(name).values,
                      [&name](size_t j) { return name + "[" + std::to_string(j) + "]"; });
  }
}

}  // namespace

TEST_CASE("the per-layer layout: ring chunks, every real element owned once", "[zero3]") {
  Communicator& comm = test_comm();
  const int N = comm.world_size(), r = comm.rank();
  for (const auto& sizes : kModels) {
    Model model(sizes, 1);
    const LayerLayout layout = plan_layer_shards(model, r, N);
    REQUIRE(layout.layers.size() == model.linear_layers().size());
    std::vector<double> owned;  // (layers) real elements, summed over ranks
    int64_t offset = 0;
    REQUIRE(layout.buckets.size() == layout.layers.size());
    for (size_t l = 0; l < layout.buckets.size(); ++l) {
      const BucketShard& s = layout.buckets[l];
      const Linear& m = *layout.layers[l];
      INFO("layer " << m.name() << " of " << s.size << " elements, N = " << N);
      REQUIRE(s.offset == model.offsets()[2 * l]);  // weight first (each layer: weight, bias)
      REQUIRE(s.size == m.weight.numel() + m.bias.numel());
      REQUIRE(s.padded_size() % N == 0);
      REQUIRE(s.padded_size() - s.size < N);                            // the least padding
      REQUIRE(s.shard_size == ring_chunk(s.padded_size(), N, r).size);  // the ring's chunk, exactly
      REQUIRE(s.shard_size == ring_chunk(s.size, N, 0).size);  // = the unpadded layer's chunks
      REQUIRE(s.shard_offset == offset);
      REQUIRE(std::accumulate(s.segments.begin(), s.segments.end(), int64_t{0}) == s.real);
      offset += s.shard_size;
      owned.push_back(static_cast<double>(s.real));
    }
    REQUIRE(layout.shard_total == offset);
    comm.all_reduce_metrics(owned);
    for (size_t l = 0; l < owned.size(); ++l)
      REQUIRE(owned[l] == static_cast<double>(layout.buckets[l].size));
  }
}

TEST_CASE("ZeRO-3 equals the per-layer ring all-reduce bit for bit; prefetch changes nothing",
          "[zero3]") {
  for (const auto& sizes : kModels) {
    for (int64_t K : {1, 3}) {
      for (float clip : {0.0f, 0.05f}) {
        Case c;
        c.sizes = sizes;
        c.grad_accum_steps = K;
        c.clip_grad_norm = clip;
        INFO("sizes[1] = " << sizes[1] << ", " << sizes.size() - 1 << " layers, K = " << K
                           << ", clip " << clip << ", N = " << test_comm().world_size() << ", rank "
                           << test_comm().rank());
        const Result reference = run_reference(c), zero3 = run_zero3(c);
        c.prefetch = false;
        const Result no_prefetch = run_zero3(c);
        require_same(c, "the unsharded per-layer ring all-reduce", reference, zero3);
        require_same(c, "the same ZeRO-3 with prefetch", zero3, no_prefetch);
        {
          INFO(
              "padding elements that are not exactly 0 after a step, summed over the steps on "
              "this rank (the padding after each bucket's real elements must stay 0; the "
              "optimizer must never see it)");
          REQUIRE(zero3.nonzero_padding == 0);
        }
        REQUIRE(zero3.optimizer.at("0.weight.step").values[0] == static_cast<float>(c.steps));
      }
    }
  }
}

TEST_CASE("ZeRO-3 in bf16: a layer computes with its gathered 16-bit parameters, widened",
          "[zero3][bf16]") {
  // The first forward of a bf16 run equals, bit for bit, chapter 01's bf16 forward of the same
  // model (16-bit parameters, each Linear's inputs and outputs rounded to bf16, fp32 compute):
  // each layer is all-gathered in 16 bits and widened to fp32 for its compute (08.1's
  // use_gathered); then, after one step, every gathered or widened layer is gone again (08.1's
  // release_parameters): model states back to the bytes the engine reports, with and without
  // prefetch.
  Communicator& comm = test_comm();
  for_each_prefetch_case([&](const Case& c) {
    const std::vector<int64_t>& sizes = c.sizes;
    INFO("sizes[1] = " << sizes[1] << ", prefetch " << c.prefetch << ", N = " << comm.world_size()
                       << ", rank " << comm.rank());
    TrainConfig config = config_of(c);
    config.precision = "bf16";
    Model unsharded(sizes, /*seed=*/5);
    ReplicatedPrecision replicated(unsharded, config, 1);  // chapter 01's bf16 model
    Tape ref_tape;
    const Batch batch = batch_of(c, comm.rank(), 0, 0);
    const std::vector<float> expected = {forward_loss(ref_tape, unsharded, batch)->value[0]};
    Ledger& ledger = Ledger::get();
    const int64_t states_before = ledger.model_states_current();
    Model model(sizes, /*seed=*/5);
    Zero3Options options;
    options.prefetch = c.prefetch;
    Zero3<bf16> zero(comm, model, config, options);
    zero.zero_grad();
    const std::vector<float> got = {micro_step(c, model, comm.rank(), 0, 0)};
    REQUIRE_SAME_BITS("the first loss in bf16 (expected: the unsharded bf16 forward)", expected,
                      got, {});
    zero.finalize_backward();
    zero.step();
    REQUIRE(ledger.model_states_current() - states_before ==
            zero.model_states_bytes()[comm.rank()]);
  });
}

TEST_CASE("memory: model states (4 + 4 + 8)Ψ/N throughout, full layers in flight as the formula",
          "[zero3]") {
  Communicator& comm = test_comm();
  for_each_prefetch_case([&](const Case& c) {
    const std::vector<int64_t>& sizes = c.sizes;
    const bool prefetch = c.prefetch;
    Ledger& ledger = Ledger::get();
    const int64_t states_before = ledger.model_states_current(),
                  buffers_before = ledger.current(MemTag::comm_buffers);
    Model model(sizes, 5);
    const int64_t psi = model.num_parameters();
    Zero3Options options;
    options.prefetch = prefetch;
    Zero3<> zero(comm, model, config_of(c), options);
    const LayerLayout& layout = zero.layout();
    const int64_t scratch =
        4 * std::max_element(layout.buckets.begin(), layout.buckets.end(), [](auto& a, auto& b) {
              return a.shard_size < b.shard_size;
            })->shard_size;
    INFO("Ψ = " << psi << ", N = " << comm.world_size() << ", prefetch " << prefetch);
    const int64_t states = zero.model_states_bytes()[comm.rank()];
    REQUIRE(ledger.model_states_current() - states_before == states);
    REQUIRE(states == 8 * layout.shard_total + 8 * layout.shard_real);
    ledger.reset_peaks();
    for (int64_t step = 0; step < 2; ++step) {
      zero.zero_grad();
      micro_step(c, model, comm.rank(), step, 0);
      zero.finalize_backward();
      zero.step();
    }
    REQUIRE(ledger.model_states_peak() - states_before == states);  // never more
    REQUIRE(ledger.peak(MemTag::comm_buffers) - buffers_before ==
            scratch + zero.in_flight_peak_bytes());
    REQUIRE(ledger.current(MemTag::comm_buffers) - buffers_before == scratch);  // every layer freed
    std::vector<double> real = {static_cast<double>(layout.shard_real)};
    comm.all_reduce_metrics(real);
    REQUIRE(real[0] == static_cast<double>(psi));  // Σ over ranks: each element once
  });
}

TEST_CASE("traffic: the counters equal the theory; evaluation is not counted as training",
          "[zero3]") {
  Communicator& comm = test_comm();
  for (int64_t K : {1, 2}) {
    for (const auto& sizes : kModels) {
      Case c;
      c.sizes = sizes;
      c.grad_accum_steps = K;
      Model model(sizes, 5);
      Zero3<> zero(comm, model, config_of(c), {});
      comm.reset_counters();
      const int64_t steps = 2;
      for (int64_t step = 0; step < steps; ++step) {
        zero.zero_grad();
        for (int64_t k = 0; k < K; ++k) micro_step(c, model, comm.rank(), step, k);
        zero.finalize_backward();
        zero.step();
      }
      Dataset test = make_synthetic(7, sizes.front(), sizes.back(), 3, 2);
      evaluate_in_lockstep(comm, model, test);
      const TrafficTheory theory = zero.traffic_theory();  // K from config_of(c)
      const Communicator::Counters t = comm.training_traffic();
      INFO("sizes[1] = " << sizes[1] << ", K = " << K << ", N = " << comm.world_size());
      REQUIRE(t.bytes_sent == steps * theory.bytes_sent[comm.rank()]);
      REQUIRE(t.bytes_received == steps * theory.bytes_received[comm.rank()]);
      const auto L = static_cast<int64_t>(zero.layout().layers.size());
      REQUIRE(comm.counters().at("ring_all_gather").calls == steps * K * 2 * L);
      REQUIRE(comm.counters().at("ring_reduce_scatter").calls == steps * K * L);
    }
  }
}

TEST_CASE("prefetch: the gather of the next layer is posted before this layer's compute ends",
          "[zero3]") {
  for (bool prefetch : {true, false}) {
    Case c;
    c.sizes = {9, 4, 6, 2, 3};
    c.steps = 1;
    c.prefetch = prefetch;
    Tracer tracer(true);
    run_zero3(c, &tracer);
    std::map<std::string, TraceEvent> first;  // each name's first event: step 1's
    for (const TraceEvent& e : tracer.events()) first.emplace(e.name, e);
    const std::vector<std::string> layers = {"0", "2", "4", "6"};
    INFO("prefetch " << prefetch << ", N = " << test_comm().world_size());
    for (size_t l = 0; l < layers.size(); ++l) {
      const TraceEvent& fwd = first.at("forward " + layers[l] + " (Linear)");
      const TraceEvent& bwd = first.at("backward " + layers[l] + " (Linear)");
      if (l + 1 < layers.size()) {  // forward: layer l+1's gather vs layer l's compute
        const TraceEvent& post = first.at("post all_gather " + layers[l + 1] + " (forward)");
        INFO("forward " << layers[l] << " ends at " << fwd.ts + fwd.dur << " us, gather of "
                        << layers[l + 1] << " posted at " << post.ts << " us");
        REQUIRE((post.seq < fwd.seq) ==
                prefetch);  // recorded before the span that ends the compute
        if (prefetch)
          REQUIRE(post.ts <= fwd.ts);  // posted before the compute even started
        else
          REQUIRE(post.ts >= fwd.ts + fwd.dur);
      }
      if (l > 0) {  // backward: layer l−1's gather vs layer l's compute
        const TraceEvent& post = first.at("post all_gather " + layers[l - 1] + " (backward)");
        REQUIRE((post.seq < bwd.seq) == prefetch);
        if (prefetch)
          REQUIRE(post.ts <= bwd.ts);
        else
          REQUIRE(post.ts >= bwd.ts + bwd.dur);
      }
    }
  }
}
