#include "common/driver/train.hpp"

#include <filesystem>

#include <algorithm>
#include <cmath>

#include "common/core/check.hpp"
#include "common/core/ops.hpp"
#include "common/io/atomic_file.hpp"
#include "common/io/safetensors.hpp"

namespace ringzero {

TrainTestData load_data(const TrainConfig& c) {
  if (c.dataset() == "fashion-mnist")
    return {load_fashion_mnist(c.data_dir, true), load_fashion_mnist(c.data_dir, false)};
  const auto sizes = c.layer_sizes();
  return {make_synthetic(1000, sizes.front(), sizes.back(), c.seed, 1),
          make_synthetic(200, sizes.front(), sizes.back(), c.seed, 2)};
}

std::unique_ptr<Model> build_model(const TrainConfig& c) {
  auto model = std::make_unique<Model>(c.layer_sizes(), c.seed);
  if (!c.init_from.empty()) {
    if (file_kind(c.init_from).empty())
      RZ_CHECK(false, "--init-from " << c.init_from << ": no such file on this rank; give a "
                                     << "safetensors file every rank can read (e.g. written by "
                                        "--save-final)");
    check_input_file("--init-from", c.init_from,
                     "give a safetensors file every rank can read (e.g. written by --save-final)");
    load_state_dict(*model, load_safetensors(c.init_from), c.init_from);
  }
  return model;
}

Batch make_batch(const Dataset& ds, std::span<const int64_t> indices) {
  const auto n = static_cast<int64_t>(indices.size());
  Batch b;
  b.x = Tensor::zeros({n, ds.in_features}, MemTag::activations);
  if (!ds.classification()) b.y = Tensor::zeros({n, ds.out_features}, MemTag::activations);
  ds.gather(indices, b.x, b.y, b.labels);
  return b;
}

EvalSums evaluate(Model& model, const Dataset& test, int64_t begin, int64_t end) {
  EvalSums sums;
  std::vector<int64_t> idx;
  for (int64_t s = begin; s < end; s += kEvalBatchSize) {
    const int64_t e = std::min(end, s + kEvalBatchSize);
    idx.resize(static_cast<size_t>(e - s));
    for (int64_t i = s; i < e; ++i) idx[i - s] = i;
    Batch batch = make_batch(test, idx);
    Tape tape;  // recorded and dropped: evaluation never calls backward
    Var out;
    Var loss = forward_loss(tape, model, batch, &out);
    sums.loss_sum += static_cast<double>(loss->value[0]) * static_cast<double>(e - s);
    sums.count += static_cast<double>(e - s);
    if (!batch.labels.empty()) {
      const Tensor host_logits = out->value.to(Device::cpu, MemTag::activations);
      auto logits = host_logits.mat();
      for (int64_t r = 0; r < logits.rows(); ++r) {
        Eigen::Index arg;
        logits.row(r).maxCoeff(&arg);
        sums.correct += (arg == batch.labels[r]) ? 1.0 : 0.0;
      }
    }
  }
  return sums;
}

std::vector<int64_t> parameter_sizes(const Model& model) {
  std::vector<int64_t> sizes;
  for (const Parameter* p : model.parameters()) sizes.push_back(p->numel());
  return sizes;
}

int64_t total_steps(const TrainConfig& c, int64_t steps_per_epoch) {
  return total_steps_checked(c.epochs, steps_per_epoch, c.max_steps);
}

}  // namespace ringzero
