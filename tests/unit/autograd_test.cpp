// Autograd: the three invariants of common/core/autograd.hpp that chapters 02, 05, 07 and 08 build
// on — backward accumulates, gradient-ready fires once per parameter after its last use, ops
// read a parameter's CURRENT storage — and the module hook order ZeRO-3 relies on.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "common/core/nn.hpp"
#include "common/core/ops.hpp"
#include "util.hpp"

using namespace ringzero;
using namespace ringzero::test;
using Catch::Matchers::Contains;

TEST_CASE("gradient-ready fires once per backward, after the parameter's last use",
          "[autograd][hooks]") {
  // h = relu(x Wᵀ + b); out = h Wᵀ + b: W and b are used twice. Backward runs the second use
  // first, so a hook firing on the first backward op that touches W would see half a gradient.
  OwnedParameter W("w", randn({4, 4}, 1)), b("b", randn({4}, 2));
  Tensor x = randn({3, 4}, 3), y = randn({3, 4}, 4);
  std::vector<std::string> fired;
  std::vector<float> w_grad_at_hook, b_grad_at_hook;
  W.p.add_grad_ready_hook([&](Parameter& p) {
    fired.push_back(p.name());
    w_grad_at_hook.assign(p.grad.span().begin(), p.grad.span().end());
  });
  b.p.add_grad_ready_hook([&](Parameter& p) {
    fired.push_back(p.name());
    b_grad_at_hook.assign(p.grad.span().begin(), p.grad.span().end());
  });
  auto run_backward = [&] {
    Tape tape;
    Var h = relu(tape, linear(tape, make_var(x), W.p, b.p));
    Var loss = mse_loss(tape, linear(tape, h, W.p, b.p), y);
    tape.backward(loss);
  };

  run_backward();
  REQUIRE(fired == std::vector<std::string>{"w", "b"});  // once each; W listed before b in linear
  // The hook saw the final gradient of this backward: both uses were already summed in.
  REQUIRE(w_grad_at_hook == std::vector<float>(W.grad.span().begin(), W.grad.span().end()));
  REQUIRE(b_grad_at_hook == std::vector<float>(b.grad.span().begin(), b.grad.span().end()));
  REQUIRE(W.grad.vec().norm() > 0);

  // A second backward fires each hook once more (and the gradient has accumulated).
  run_backward();
  REQUIRE(fired == std::vector<std::string>{"w", "b", "w", "b"});
  REQUIRE(w_grad_at_hook == std::vector<float>(W.grad.span().begin(), W.grad.span().end()));

  W.p.clear_grad_ready_hooks();
  run_backward();
  REQUIRE(fired.size() == 5);  // only b's hook is left
}

TEST_CASE("module hooks run in forward and reverse order around each layer", "[autograd][hooks]") {
  // Three Linear layers (with two ReLUs between): ZeRO-3 gathers a layer's weights in its
  // pre-forward and pre-backward hooks and frees them in the post hooks, so the order of the
  // events, and the gradient-ready hooks falling between a layer's pre and post backward, matter.
  Model model({3, 4, 4, 2}, 5);
  std::vector<std::string> events;
  for (auto& layer : model.net.layers) {
    layer->add_pre_forward_hook([&](Module& m) { events.push_back("pre_forward " + m.name()); });
    layer->add_post_forward_hook([&](Module& m) { events.push_back("post_forward " + m.name()); });
    layer->add_pre_backward_hook([&](Module& m) { events.push_back("pre_backward " + m.name()); });
    layer->add_post_backward_hook(
        [&](Module& m) { events.push_back("post_backward " + m.name()); });
  }
  for (Parameter* p : model.parameters())
    p->add_grad_ready_hook([&](Parameter& q) { events.push_back("grad_ready " + q.name()); });

  Tape tape;
  Var loss = mse_loss(tape, model.forward(tape, make_var(randn({2, 3}, 6))), randn({2, 2}, 7));
  const std::vector<std::string> forward{
      "pre_forward 0",  "post_forward 0", "pre_forward 1",  "post_forward 1", "pre_forward 2",
      "post_forward 2", "pre_forward 3",  "post_forward 3", "pre_forward 4",  "post_forward 4"};
  REQUIRE(events == forward);

  events.clear();
  tape.backward(loss);
  const std::vector<std::string> backward{
      "pre_backward 4",    "grad_ready 4.weight", "grad_ready 4.bias", "post_backward 4",
      "pre_backward 3",    "post_backward 3",     "pre_backward 2",    "grad_ready 2.weight",
      "grad_ready 2.bias", "post_backward 2",     "pre_backward 1",    "post_backward 1",
      "pre_backward 0",    "grad_ready 0.weight", "grad_ready 0.bias", "post_backward 0"};
  REQUIRE(events == backward);
}

TEST_CASE("ModuleHooks removes its owner's hooks, and only those, when it goes",
          "[autograd][hooks]") {
  // An engine (chapters 07-08) hooks the layers through a ModuleHooks member: once the engine
  // is gone its hooks must not run (they would call into a destroyed object), while hooks that
  // others added (a tracer's) stay, in their order.
  Model model({3, 4, 2}, 5);
  Module& layer = *model.net.layers[0];
  std::vector<std::string> events;
  const uint64_t kept = layer.add_pre_forward_hook([&](Module&) { events.push_back("kept"); });
  auto forward_and_backward = [&] {
    events.clear();
    Tape tape;
    Var loss = mse_loss(tape, model.forward(tape, make_var(randn({2, 3}, 6))), randn({2, 2}, 7));
    tape.backward(loss);
  };
  {
    ModuleHooks hooks;
    hooks.pre_forward(layer, [&](Module&) { events.push_back("pre_forward"); });
    hooks.post_forward(layer, [&](Module&) { events.push_back("post_forward"); });
    hooks.pre_backward(layer, [&](Module&) { events.push_back("pre_backward"); });
    hooks.post_backward(layer, [&](Module&) { events.push_back("post_backward"); });
    forward_and_backward();
    REQUIRE(events == std::vector<std::string>{"kept", "pre_forward", "post_forward",
                                               "pre_backward", "post_backward"});
  }
  forward_and_backward();
  REQUIRE(events == std::vector<std::string>{"kept"});
  layer.remove_hook(kept);
  layer.remove_hook(12345);  // an unknown id does nothing
  forward_and_backward();
  REQUIRE(events.empty());
}

TEST_CASE("backward reads the parameter's current storage", "[autograd][hooks]") {
  // ZeRO-3 frees a layer's weights after forward and gathers them again, maybe elsewhere,
  // before backward. Re-point W.data at a buffer with OTHER values and poison the old one:
  // d inp must be computed from the new values (dinp = dout · W_new).
  OwnedParameter W("w", randn({5, 4}, 1)), b("b", randn({5}, 2));
  Tensor x = randn({3, 4}, 3), y = randn({3, 5}, 4);
  Var inp = make_var(x, /*requires_grad=*/true);
  Tape tape;
  Var out = linear(tape, inp, W.p, b.p);
  Var loss = mse_loss(tape, out, y);

  Tensor w_new = randn({5, 4}, 99);
  Tensor w_old = W.p.data;
  W.p.data = w_new;
  for (float& v : w_old.span()) v = std::nanf("");
  tape.backward(loss);

  // dout = 2 (out - y) / numel, with out from the forward (old weights).
  for (int64_t bi = 0; bi < 3; ++bi) {
    for (int64_t c = 0; c < 4; ++c) {
      double expected = 0;
      for (int64_t o = 0; o < 5; ++o) {
        const double dout = 2.0 * (out->value[bi * 5 + o] - y[bi * 5 + o]) / 15.0;
        expected += dout * w_new[o * 4 + c];
      }
      REQUIRE(inp->grad[bi * 4 + c] == Approx(expected).epsilon(1e-5));
    }
  }
}

TEST_CASE("backward accumulates into the parameter's current gradient storage", "[autograd]") {
  // Chapter 05 points a parameter's grad into a bucket: backward must write there.
  OwnedParameter W("w", randn({2, 3}, 1)), b("b", randn({2}, 2));
  Tensor x = randn({4, 3}, 3), y = randn({4, 2}, 4);
  Tape tape;
  Var loss = mse_loss(tape, linear(tape, make_var(x), W.p, b.p), y);
  Tensor bucket = Tensor::zeros({2, 3}, MemTag::comm_buffers);
  W.p.grad = bucket;
  tape.backward(loss);
  REQUIRE(bucket.vec().norm() > 0);
  REQUIRE(W.grad.vec().norm() == 0);
}

TEST_CASE("two backwards sum their gradients; the seed scales them", "[autograd]") {
  // Gradient accumulation (chapter 02) is nothing but this. Tolerance: 1e-6 relative, the
  // float32 rounding of one addition per element (measured: exact on these shapes).
  Model model({4, 3, 2}, 1);
  Tensor x1 = randn({5, 4}, 2), y1 = randn({5, 2}, 3), x2 = randn({5, 4}, 4), y2 = randn({5, 2}, 5);
  auto backward = [&](const Tensor& x, const Tensor& y, float seed) {
    Tape tape;
    tape.backward(mse_loss(tape, model.forward(tape, make_var(x)), y), seed);
  };
  auto grads = [&] {
    return std::vector<float>(model.grads_memory.span().begin(), model.grads_memory.span().end());
  };
  model.zero_grad();
  backward(x1, y1, 1.0f);
  const auto g1 = grads();
  model.zero_grad();
  backward(x2, y2, 1.0f);
  const auto g2 = grads();
  model.zero_grad();
  backward(x1, y1, 1.0f);
  backward(x2, y2, 1.0f);
  const auto sum = grads();
  for (size_t i = 0; i < sum.size(); ++i)
    REQUIRE(sum[i] == Approx(g1[i] + g2[i]).epsilon(1e-6).margin(1e-12));

  // backward(loss, 1/2) is (loss / 2).backward(): exactly half (a power of two).
  model.zero_grad();
  backward(x1, y1, 0.5f);
  const auto half = grads();
  for (size_t i = 0; i < half.size(); ++i) REQUIRE(half[i] == g1[i] * 0.5f);
}

TEST_CASE("backward refuses a non-scalar loss or one without parameters", "[autograd]") {
  Tape tape;
  REQUIRE_THROWS_WITH(tape.backward(make_var(randn({2}, 1), true)), Contains("scalar"));
  REQUIRE_THROWS_WITH(tape.backward(make_var(randn({1}, 1), false)), Contains("does not depend"));
}
