// Unused parameters mean the same in chapters 05-08 (issue 9, item 8), under mpirun, np 1..4.
// A model 8 -> 16 -> 16 -> 4 whose forward skips its middle layer ("2") on every rank: that
// layer runs on no rank in the step. Chapter 05's DDP fails naming 2.weight and 2.bias unless
// find_unused_parameters, which counts their gradient as zero (tests/mpi/ddp.cpp); chapters
// 06-07 share DDP's bucket code for it. Chapter 08's ZeRO-3 must agree:
//  - without find_unused_parameters every rank fails with DDP's message (before: the layer was
//    silently stepped with a zero gradient; with prefetch, layer 2's gather, posted while layer
//    0 ran, made it fail "layer 2 is still gathered after backward");
//  - with it, training goes on, with and without prefetch: the unused layer keeps its weights
//    exactly (SGD without weight decay: a zero gradient moves nothing), and the used layers
//    equal DDP's within float rounding (relative L2 1e-6: DDP sums each parameter's chunks,
//    ZeRO-3 each layer's, so at N >= 3 the ring adds the same numbers in another order; ~1e-7
//    measured, one wrong sample would be ~1e-1).
#include <cmath>
#include <string>
#include <vector>

#include "chapters/05_ddp_buckets/ddp.hpp"
#include "chapters/08_zero3/zero3.hpp"
#include "common/core/ops.hpp"
#include "common/core/optim.hpp"
#include "common/core/rng.hpp"
#include "common/zero/shard_state.hpp"
#include "mpi/test_comm.hpp"

#include <catch2/catch.hpp>

using namespace ringzero;
using Catch::Matchers::Contains;

namespace {

Batch rank_batch(int rank, int64_t step) {
  Batch b;
  b.x = Tensor::zeros({6, 8}, MemTag::activations);
  b.y = Tensor::zeros({6, 4}, MemTag::activations);
  Rng rng(300 + rank, static_cast<uint64_t>(step));
  for (float& v : b.x.span()) v = rng.normal();
  for (float& v : b.y.span()) v = rng.normal();
  return b;
}

// Forward through layers "0" and "4" only, through the modules (so ZeRO-3's hooks run), and
// backward.
void backward_skipping_layer2(Model& model, const Batch& batch) {
  auto layers = model.linear_layers();  // 0, 2, 4
  Tape tape;
  Var h = relu(tape, (*layers[0])(tape, make_var(batch.x)));
  Var out = (*layers[2])(tape, h);
  tape.backward(mse_loss(tape, out, batch.y));
}

TrainConfig sgd() {
  TrainConfig c;
  c.optimizer = "sgd";
  c.lr = 0.1f;
  c.weight_decay = 0.0f;
  c.momentum = 0.0f;
  return c;
}

constexpr int64_t kSteps = 3;

std::vector<float> train_ddp(bool find_unused) {
  Communicator& comm = test_comm();
  Model model({8, 16, 16, 4}, /*seed=*/4);
  Optimizer optimizer(sgd(), parameter_sizes(model));
  DDP ddp(comm, model, TrainConfig{}, {.find_unused_parameters = find_unused});
  for (int64_t step = 0; step < kSteps; ++step) {
    model.zero_grad();
    backward_skipping_layer2(model, rank_batch(comm.rank(), step));
    ddp.finalize_backward();
    optimizer.step(model.params_memory.span(), model.grads_memory.span());
  }
  return {model.params_memory.data(), model.params_memory.data() + model.num_parameters()};
}

std::vector<float> train_zero3(bool find_unused, bool prefetch) {
  Communicator& comm = test_comm();
  Model model({8, 16, 16, 4}, /*seed=*/4);
  Zero3<> zero(comm, model, sgd(), {.prefetch = prefetch, .find_unused_parameters = find_unused});
  for (int64_t step = 0; step < kSteps; ++step) {
    zero.zero_grad();
    backward_skipping_layer2(model, rank_batch(comm.rank(), step));
    zero.finalize_backward();
    zero.step();
  }
  std::vector<float> out;
  const auto state = sharded_model_state_dict(zero, model);
  for (const Parameter* p : model.parameters()) {
    const auto& v = state.at(p->name()).values;
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

}  // namespace

TEST_CASE("a layer that runs on no rank: ZeRO-3 fails as DDP does, naming its parameters",
          "[zero3][ddp][unused]") {
  // (Catch2 keeps references to the matchers it combines: written out in each assertion.)
  REQUIRE_THROWS_WITH(train_ddp(false),
                      Contains("received no gradient in this backward: 2.weight, 2.bias") &&
                          Contains("--find-unused-parameters"));
  for (bool prefetch : {true, false}) {
    INFO("prefetch " << prefetch);
    REQUIRE_THROWS_WITH(train_zero3(false, prefetch),
                        Contains("received no gradient in this backward: 2.weight, 2.bias") &&
                            Contains("--find-unused-parameters"));
  }
}

TEST_CASE("with find_unused_parameters ZeRO-3 trains on as DDP does: zero gradient, same weights",
          "[zero3][ddp][unused]") {
  const std::vector<float> ddp = train_ddp(true);
  const Model start({8, 16, 16, 4}, /*seed=*/4);
  const int64_t w2 = start.offsets()[2], end2 = start.offsets()[4];  // 2.weight, 2.bias
  for (bool prefetch : {true, false}) {
    INFO("prefetch " << prefetch);
    const std::vector<float> zero3 = train_zero3(true, prefetch);
    REQUIRE(zero3.size() == ddp.size());
    double diff = 0, norm = 0;
    for (size_t i = 0; i < ddp.size(); ++i) {
      const auto j = static_cast<int64_t>(i);
      if (j >= w2 && j < end2) {  // the unused layer: untouched by both, bit for bit
        REQUIRE(zero3[i] == start.params_memory.data()[i]);
        REQUIRE(ddp[i] == start.params_memory.data()[i]);
        continue;
      }
      diff += std::pow(static_cast<double>(zero3[i]) - ddp[i], 2);
      norm += std::pow(static_cast<double>(ddp[i]) - start.params_memory.data()[i], 2);
    }
    REQUIRE(norm > 0);  // the used layers did move
    REQUIRE(std::sqrt(diff) <= 1e-6 * std::sqrt(norm));
  }
}
