// ZeRO-3's members that are not the lesson: what it reports (model-state and in-flight bytes,
// the traffic theory, the ledger's formula line), how it evaluates in lockstep, what it saves
// (--save-final, --save-optimizer-state: the shards all-gathered one layer at a time) and what
// the tests check (the padding stays zero). zero3.hpp declares them.
// Leaves out: everything the training step does (zero3.hpp).
#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "chapters/08_zero3/zero3.hpp"
#include "common/shard_state.hpp"

namespace ringzero {

/// p per element of the parameter shard, sizeof(R) per element of the gradient shard (Σ s_l
/// each, padding included), K per real element: fp32 4 + 4 + K of --optimizer; 16 bits 2 + 2
/// (4 with --reduce-dtype fp32) + 12 (master weights, exp_avg, exp_avg_sq).
template <Element T, Element R>
std::vector<int64_t> Zero3<T, R>::model_states_bytes() const {
  const StateBytes states = optimizer_.state_bytes();
  std::vector<int64_t> bytes;
  for (int r = 0; r < comm_.world_size(); ++r)
    bytes.push_back(static_cast<int64_t>(states.param + element_bytes<R>()) * layout_.shard_total +
                    static_cast<int64_t>(states.optimizer) *
                        plan_layer_shards(model_, r, comm_.world_size()).shard_real);
  return bytes;
}

template <Element T, Element R>
int64_t Zero3<T, R>::in_flight_peak_bytes() const {
  return ringzero::in_flight_peak_bytes(layout_, options_.prefetch, element_bytes<T>(),
                                        element_bytes<R>());
}

template <Element T, Element R>
TrafficTheory Zero3<T, R>::traffic_theory() const {
  return zero3_traffic_theory(layout_, comm_.world_size(), psi_, grad_accum_steps_,
                              options_.collectives, element_bytes<T>(), element_bytes<R>());
}

template <Element T, Element R>
EngineDescription Zero3<T, R>::describe() const {
  std::vector<int64_t> sizes;  // P_l per layer, in forward order (the cost model replays them)
  std::vector<ShardUnit> units;
  for (const LayerShard& s : layout_.layers) {
    sizes.push_back(s.padded_size);
    units.push_back({s.offset, s.numel, s.shard_size});
  }
  return {.zero_stage = 3,
          .unit = "layers",
          .unit_sizes = std::move(sizes),
          .collectives = options_.collectives,
          .prefetch = options_.prefetch,
          .world_size = comm_.world_size(),
          .units = std::move(units),
          .padding = comm_.world_size() * layout_.shard_total - psi_,
          .in_flight_peak_bytes = in_flight_peak_bytes(),
          .layer_spans = false};  // zero3.hpp times each layer's compute itself
}

template <Element T, Element R>
std::string Zero3<T, R>::ledger_formula() const {
  StateBytes states_ = optimizer_.state_bytes();
  states_.grad = element_bytes<R>();  // the gradient shard holds the reduce dtype
  const ModelStateBytes f =
      zero_model_state_bytes(3, static_cast<double>(psi_), comm_.world_size(), states_);
  std::string exact;
  for (int64_t b : model_states_bytes()) exact += (exact.empty() ? "" : ", ") + std::to_string(b);
  return "formula (ZeRO-3, " + std::string(states_.name) + "): " + zero_formula_text(3, states_) +
         " = " + human_bytes(f.total()) + " per rank (DDP: " + full_copy_formula_text(states_) +
         " = " + human_bytes(states_.per_param() * static_cast<double>(psi_)) +
         "); exactly, with padding " +
         std::to_string(comm_.world_size() * layout_.shard_total - psi_) + ": " +
         std::to_string(static_cast<int>(states_.param)) + "Σs_l + " +
         std::to_string(element_bytes<R>()) + "Σs_l + " +
         std::to_string(static_cast<int>(states_.optimizer)) + "·(real shard) = " + exact +
         " B on ranks 0..N-1; comm_buffers at the peak: full layers in flight " +
         (!options_.prefetch ? "8·max P_l = "
          : std::is_same_v<T, float>
              ? "4·max(P_l-1 + 2P_l + P_l+1) = "
              : "max(" + std::to_string(element_bytes<T>()) + "P_l-1 + 8P_l + " +
                    std::to_string(element_bytes<R>()) + "P_l+1) = ") +
         std::to_string(in_flight_peak_bytes()) + " B + one ring chunk " +
         std::to_string(collectives_.scratch_bytes()) + " B";
}

/// Every forward now makes collectives, so every rank must run as many forwards as the
/// others, but eval_range's shares differ by a batch (10 000 samples on 3 ranks) or are empty:
/// a rank with fewer batches runs padding batches and drops their results (PyTorch's
/// DistributedSampler pads with repeated samples for the same reason). The sums are
/// evaluate_distributed's, exactly. Its all-gathers are counted as "metrics": they are not a
/// training step's traffic.
template <Element T, Element R>
EvalResult Zero3<T, R>::evaluate(const Dataset& test) {
  const auto before = comm_.counters();
  const int N = comm_.world_size();
  int64_t most = 0;  // the largest share, in batches
  for (int q = 0; q < N; ++q) {
    const auto [b, e] = eval_range(test.size, q, N);
    most = std::max(most, (e - b + kEvalBatchSize - 1) / kEvalBatchSize);
  }
  const auto [begin, end] = eval_range(test.size, comm_.rank(), N);
  EvalSums sums;
  for (int64_t i = 0; i < most; ++i) {
    const int64_t s = begin + i * kEvalBatchSize;
    const EvalSums e = ringzero::evaluate(
        model_, test, s < end ? s : 0,
        s < end ? std::min(end, s + kEvalBatchSize) : std::min(test.size, kEvalBatchSize));
    if (s < end)
      sums.loss_sum += e.loss_sum, sums.correct += e.correct,
          sums.count += e.count;  // else padding: dropped
  }
  comm_.recount_as_metrics(before);
  return reduce_eval(comm_, sums, test);
}

/// `of(l)`: the real elements of layer l's shard, of the parameters or of an optimizer state.
/// Each layer goes through layer_collectives.hpp as a kStateGather, behind the desync check.
template <Element T, Element R>
std::map<std::string, NamedTensor> Zero3<T, R>::gather_full(
    const std::function<std::span<const float>(size_t)>& of, const std::string& suffix) {
  std::map<std::string, NamedTensor> out;
  for (size_t l = 0; l < layout_.layers.size(); ++l) {
    const LayerShard& s = layout_.layers[l];
    Buffer full(s.padded_size, MemTag::comm_buffers);  // (P_l) one layer
    std::span<const float> mine = of(l);
    std::copy(mine.begin(), mine.end(), full.data() + comm_.rank() * s.shard_size);
    collectives_.wait(collectives_.all_gather(static_cast<int>(l), kStateGather, full.span()), "");
    for (auto [p, begin] :
         {std::pair{&s.layer->weight, int64_t{0}}, std::pair{&s.layer->bias, s.weight_numel}})
      out[p->name() + suffix] = {p->shape(),
                                 {full.data() + begin, full.data() + begin + p->numel()}};
  }
  return out;
}

template <Element T, Element R>
std::map<std::string, NamedTensor> Zero3<T, R>::model_state_dict() {
  if constexpr (std::is_same_v<T, float>)
    return gather_full(
        [this](size_t l) { return std::span<const float>(shard(params_, layout_.layers[l])); });
  else
    return gather_full([this](size_t l) { return optimizer_.master(l); });
}

/// "<param>.exp_avg", ".exp_avg_sq" (the parameter's shape) and ".step" (shape (1)): the fp32
/// optimizer's, or in 16 bits the master weights' moments, named the same.
/// Errors: not --optimizer adamw.
template <Element T, Element R>
std::map<std::string, NamedTensor> Zero3<T, R>::optimizer_state_dict() {
  auto out = gather_full([this](size_t l) { return optimizer_.exp_avg(l); }, ".exp_avg");
  out.merge(gather_full([this](size_t l) { return optimizer_.exp_avg_sq(l); }, ".exp_avg_sq"));
  for (size_t l = 0; l < layout_.layers.size(); ++l) {
    const LayerShard& s = layout_.layers[l];
    for (Parameter* p : {&s.layer->weight, &s.layer->bias}) {
      std::vector<double> step_and_owner = {0,
                                            0};  // every piece of a parameter took the same steps
      for (size_t k = 0; k < s.segment_params.size(); ++k)
        if (s.segment_params[k] == p)
          step_and_owner = {static_cast<double>(optimizer_.segment_steps(l)[k]), 1};
      comm_.all_reduce_metrics(step_and_owner);
      out[p->name() + ".step"] = {{1}, {static_cast<float>(step_and_owner[0] / step_and_owner[1])}};
    }
  }
  return out;
}

template <Element T, Element R>
int64_t Zero3<T, R>::nonzero_padding() const {
  int64_t count = 0;
  for (const LayerShard& s : layout_.layers)
    for (int64_t i = s.shard_offset + s.real; i < s.shard_offset + s.shard_size; ++i)
      count += (static_cast<float>(params_.span()[i]) != 0.0f) +
               (static_cast<float>(grads_.span()[i]) != 0.0f);
  return count;
}

template <Element T, Element R>
TrainingState Zero3<T, R>::training_state() {
  return sharded_training_state(describe(), model_, comm_.rank(), optimizer_, params_.span());
}

template class Zero3<float, float>;
template class Zero3<bf16, bf16>;
template class Zero3<bf16, float>;
template class Zero3<fp16, fp16>;
template class Zero3<fp16, float>;

}  // namespace ringzero
