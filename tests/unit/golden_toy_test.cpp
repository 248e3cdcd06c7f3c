// The external reference: chapter 01's training step on the seeds' ToyModel reproduces
// PyTorch 1.13 (losses and final weights over 5 AdamW steps), from PyTorch's own initial
// weights and a fixed batch, both committed in tests/golden/ by make_toy_golden.py.
//
// The step is chapter 01's own train_step (chapters/01_training_loop/training_loop.hpp), with
// the flags' defaults (AdamW lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 1e-2).
//
// Why not bitwise: Eigen and OpenBLAS sum each GEMM's dot products in different orders
// (float32, relative differences ~1e-7), and the MSE is accumulated differently. Adam's step
// lr · m̂ / (sqrt(v̂) + eps) is nearly lr · sign(g) where |g| >> eps = 1e-8, so those differences
// barely move most weights; but where |g| is itself ~1e-8 the step depends on g's last digits,
// and a few weights differ by up to a few lr-steps' worth of rounding.
// Tolerances, against a movement of up to 5e-3 per weight over the 5 steps (measured worst in
// parentheses): loss 1e-6 relative (1.0e-7); every compared weight within 5e-5, 1 % of
// the movement (1.2e-5, at an element whose first gradient is -3.5e-9); 99.9 % of them
// within 1e-6 (19 of 286070 above 1e-6); row sums of 1024 weights within 1e-4, as a row can
// hold several of those (3.6e-5).
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>

#include "chapters/01_training_loop/training_loop.hpp"
#include "common/safetensors.hpp"
#include "common/train.hpp"

using namespace ringzero;

namespace {

const std::string kGolden = std::string(RINGZERO_SOURCE_DIR) + "/tests/golden/";

Tensor to_tensor(const NamedTensor& t) {
  Tensor out = Tensor::zeros(t.shape, MemTag::activations);
  std::copy(t.values.begin(), t.values.end(), out.data());
  return out;
}

// Worst |a - b| and how many elements differ by more than 1e-6, over every comparison.
struct Diffs {
  double worst = 0;
  int64_t above_1e6 = 0, count = 0;
  void add(std::span<const float> a, std::span<const float> b) {
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      double d = std::fabs(static_cast<double>(a[i]) - b[i]);
      if (std::isnan(d)) d = INFINITY;  // std::max would drop a NaN and pass the test
      worst = std::max(worst, d);
      above_1e6 += d > 1e-6;
    }
    count += static_cast<int64_t>(a.size());
  }
};

}  // namespace

TEST_CASE("chapter 01's step on the ToyModel matches PyTorch over 5 AdamW steps", "[golden]") {
  TrainConfig config;  // the flags' defaults: --optimizer adamw --lr 1e-3 --weight-decay 1e-2
  config.model = "toy";
  Model model(config.layer_sizes(), 0);
  load_state_dict(model, load_safetensors(kGolden + "toy_init.safetensors"),
                  "toy_init.safetensors");
  const auto batch_tensors = load_safetensors(kGolden + "toy_batch.safetensors");
  Batch batch;
  batch.x = to_tensor(batch_tensors.at("x"));  // (64, 1024)
  batch.y = to_tensor(batch_tensors.at("y"));  // (64, 256)
  Tracer tracer;  // off
  SetUp setup{nullptr, model, config, tracer};
  TrainingLoop loop(setup);

  std::ifstream losses_file(kGolden + "toy_losses.json");
  REQUIRE(losses_file);
  const auto torch_losses =
      nlohmann::json::parse(losses_file).at("losses").get<std::vector<double>>();
  REQUIRE(torch_losses.size() == 5);

  double worst_loss = 0;
  for (size_t step = 0; step < torch_losses.size(); ++step) {
    const double ours = train_step(
        loop, Step{model, config, static_cast<int64_t>(step) + 1,
                   [&](int64_t micro_step) {
                     REQUIRE(micro_step == 0);  // chapter 01: the whole batch at once
                     return batch;
                   },
                   tracer});
    INFO("step " << step + 1 << ": ours " << ours << ", PyTorch " << torch_losses[step]);
    const double rel = std::fabs(ours - torch_losses[step]) / torch_losses[step];
    worst_loss = std::max(worst_loss, rel);
    REQUIRE(rel <= 1e-6);
  }

  const auto final = load_safetensors(kGolden + "toy_final.safetensors");
  const auto ours = state_dict(model);
  Diffs weights, row_sums;
  for (const char* name : {"0.bias", "2.bias", "4.weight", "4.bias"})
    weights.add(ours.at(name).values, final.at(name).values);
  for (const std::string name : {"0.weight", "2.weight"}) {
    const auto& w = ours.at(name).values;  // (1024, 1024)
    std::vector<float> every97, sums(1024);
    for (size_t i = 0; i < w.size(); i += 97) every97.push_back(w[i]);
    for (size_t r = 0; r < 1024; ++r) {
      double s = 0;
      for (size_t c = 0; c < 1024; ++c) s += w[r * 1024 + c];
      sums[r] = static_cast<float>(s);
    }
    weights.add(every97, final.at(name + ".every97").values);
    row_sums.add(sums, final.at(name + ".row_sums").values);
  }
  INFO("weights: worst |ours - PyTorch| " << weights.worst << ", " << weights.above_1e6 << " of "
                                          << weights.count << " above 1e-6; row sums: worst "
                                          << row_sums.worst);
  REQUIRE(weights.count == 2 * 10811 + 1024 + 1024 + 262144 + 256);
  REQUIRE(weights.worst <= 5e-5);
  REQUIRE(weights.above_1e6 <= weights.count / 1000);
  REQUIRE(row_sums.worst <= 1e-4);
  // The weights did move: a test comparing the initial state with itself would pass too.
  const auto init = load_safetensors(kGolden + "toy_init.safetensors");
  Diffs moved;
  moved.add(init.at("4.weight").values, final.at("4.weight").values);
  REQUIRE(moved.worst > 4e-3);
  WARN("golden ToyModel vs PyTorch: worst relative loss difference "
       << worst_loss << "; weights: worst " << weights.worst << ", " << weights.above_1e6 << " of "
       << weights.count << " above 1e-6; row sums: worst " << row_sums.worst);
}
