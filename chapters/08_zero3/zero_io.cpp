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

namespace ringzero {

std::vector<int64_t> Zero3::model_states_bytes() const {
  std::vector<int64_t> bytes;
  for (int r = 0; r < comm_.world_size(); ++r)
    bytes.push_back(static_cast<int64_t>(states_.param + states_.grad) * layout_.shard_total +
                    static_cast<int64_t>(states_.optimizer) *
                        plan_layer_shards(model_, r, comm_.world_size()).shard_real);
  return bytes;
}

int64_t Zero3::in_flight_peak_bytes() const {
  return ringzero::in_flight_peak_bytes(layout_, options_.prefetch, gather_bytes(), reduce_bytes());
}

TrafficTheory Zero3::traffic_theory(int64_t grad_accum_steps) const {
  return zero3_traffic_theory(layout_, comm_.world_size(), psi_, grad_accum_steps,
                              options_.collectives, gather_bytes(), reduce_bytes());
}

std::string Zero3::ledger_formula() const {
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
         std::to_string(static_cast<int>(states_.grad)) + "Σs_l + " +
         std::to_string(static_cast<int>(states_.optimizer)) + "·(real shard) = " + exact +
         " B on ranks 0..N-1; comm_buffers at the peak: full layers in flight " +
         (!options_.prefetch      ? "8·max P_l = "
          : dtype_ == Dtype::fp32 ? "4·max(P_l-1 + 2P_l + P_l+1) = "
                                  : "max(" + std::to_string(gather_bytes()) + "P_l-1 + 8P_l + " +
                                        std::to_string(reduce_bytes()) + "P_l+1) = ") +
         std::to_string(in_flight_peak_bytes()) + " B + one ring chunk " +
         std::to_string(scratch_.bytes() + scratch16_.bytes()) + " B";
}

/// Every forward now makes collectives, so every rank must run as many forwards as the
/// others, but eval_range's shares differ by a batch (10 000 samples on 3 ranks) or are empty:
/// a rank with fewer batches runs padding batches and drops their results (PyTorch's
/// DistributedSampler pads with repeated samples for the same reason). The sums are
/// evaluate_distributed's, exactly. Its all-gathers are counted as "metrics": they are not a
/// training step's traffic.
EvalResult Zero3::evaluate(const Dataset& test) {
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
/// Each layer goes through post() as a kStateGather, behind the desync check.
std::map<std::string, NamedTensor> Zero3::gather_full(
    const std::function<std::span<const float>(size_t)>& of, const std::string& suffix) {
  std::map<std::string, NamedTensor> out;
  for (size_t l = 0; l < layout_.layers.size(); ++l) {
    const LayerShard& s = layout_.layers[l];
    Buffer full(s.padded_size, MemTag::comm_buffers);  // (P_l) one layer
    std::span<const float> mine = of(l);
    std::copy(mine.begin(), mine.end(), full.data() + comm_.rank() * s.shard_size);
    comm_thread_.wait(post(static_cast<int>(l), kStateGather, full.data()));
    for (auto [p, begin] :
         {std::pair{&s.layer->weight, int64_t{0}}, std::pair{&s.layer->bias, s.weight_numel}})
      out[p->name() + suffix] = {p->shape(),
                                 {full.data() + begin, full.data() + begin + p->numel()}};
  }
  return out;
}

/// "<param>.exp_avg", ".exp_avg_sq" (the parameter's shape) and ".step" (shape (1)).
/// Errors: not --optimizer adamw.
/// In 16 bits the moments are the master weights' (MasterWeights), named the same.
std::map<std::string, NamedTensor> Zero3::optimizer_state_dict() {
  for (const Optimizer& o : optimizers_)
    RZ_CHECK(o.adamw(), "optimizer state is saved for --optimizer adamw only");
  const bool half = dtype_ != Dtype::fp32;
  auto out = gather_full(
      [this, half](size_t l) {
        return half ? masters_[l].exp_avg() : optimizers_[l].adamw()->exp_avg();
      },
      ".exp_avg");
  out.merge(gather_full(
      [this, half](size_t l) {
        return half ? masters_[l].exp_avg_sq() : optimizers_[l].adamw()->exp_avg_sq();
      },
      ".exp_avg_sq"));
  for (size_t l = 0; l < layout_.layers.size(); ++l) {
    const LayerShard& s = layout_.layers[l];
    for (Parameter* p : {&s.layer->weight, &s.layer->bias}) {
      std::vector<double> step_and_owner = {0,
                                            0};  // every piece of a parameter took the same steps
      for (size_t k = 0; k < s.segment_params.size(); ++k)
        if (s.segment_params[k] == p)
          step_and_owner = {static_cast<double>(half ? masters_[l].segment_steps()[k]
                                                     : optimizers_[l].adamw()->segment_steps()[k]),
                            1};
      comm_.all_reduce_metrics(step_and_owner);
      out[p->name() + ".step"] = {{1}, {static_cast<float>(step_and_owner[0] / step_and_owner[1])}};
    }
  }
  return out;
}

int64_t Zero3::nonzero_padding() const {
  int64_t count = 0;
  for (const LayerShard& s : layout_.layers)
    for (int64_t i = s.shard_offset + s.real; i < s.shard_offset + s.shard_size; ++i)
      count += dtype_ == Dtype::fp32 ? (params_.span()[i] != 0.0f) + (grads_.span()[i] != 0.0f)
                                     : (params16_.span()[i] != 0) + (grads16_.span()[i] != 0);
  return count;
}

TrainingState Zero3::training_state() {
  RZ_CHECK(dtype_ == Dtype::fp32, "ZeRO-3 checkpoints hold fp32 training state only");
  TrainingState state;
  state.model = &model_;
  state.sharded = true;
  state.params_replicated = false;  // the parameters exist only as shards
  state.chapter = "08_zero3";
  state.zero_stage = 3;
  state.layout = {{"kind", "layers"}};
  const auto& params = model_.parameters();
  for (const LayerShard& s : layout_.layers) {
    state.layout["layers"].push_back({{"name", s.layer->name()},
                                      {"offset", s.offset},
                                      {"numel", s.numel},
                                      {"padding", s.padded_size - s.numel},
                                      {"shard_size", s.shard_size}});
    std::vector<int> segment_params;
    for (Parameter* p : s.segment_params)
      segment_params.push_back(
          static_cast<int>(std::find(params.begin(), params.end(), p) - params.begin()));
    state.pieces.push_back({shard(params_, s), s.offset + comm_.rank() * s.shard_size,
                            &optimizers_[&s - layout_.layers.data()], std::move(segment_params)});
  }
  return state;
}

}  // namespace ringzero
