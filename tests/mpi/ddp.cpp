// Chapter 05's DDP (chapters/05_ddp_buckets/ddp.hpp) under mpirun, np 1..4:
//  - the synchronised gradients equal, bit for bit, the local gradients all-reduced bucket by
//    bucket with chapter 04's ring and divided by N (the reference is computed here from a
//    no_sync backward of the same batch), for one bucket, several, and one per parameter;
//  - gradients become ready in reverse registration order, layer by layer, also after an
//    evaluation forward that was never backpropagated;
//  - the first bucket's all-reduce is launched during backward and starts on the comm thread
//    before backward ends (recorded trace events: sequence numbers and timestamps);
//  - the traffic of one synchronised backward equals the ring theory per bucket, and a
//    backward inside no_sync sends zero bytes;
//  - a parameter with no gradient: without find_unused_parameters every rank fails naming it
//    (no hang); with it, its bucket completes with a zero gradient;
//  - different bucket plans on different ranks: every rank fails, showing both plans;
//  - a comm-thread job's error reaches the main thread.
#include <cstring>
#include <stdexcept>
#include <vector>

#include "chapters/05_ddp_buckets/ddp.hpp"
#include "common/core/ops.hpp"
#include "common/core/rng.hpp"
#include "mpi/difference_report.hpp"
#include "mpi/test_comm.hpp"

#include <catch2/catch.hpp>

using namespace ringzero;
using Catch::Matchers::Contains;

namespace {

// A regression batch that differs on every rank: (B, in) inputs, (B, out) targets.
Batch rank_batch(int64_t B, int64_t in, int64_t out, int rank) {
  Batch b;
  b.x = Tensor::zeros({B, in}, MemTag::activations);
  b.y = Tensor::zeros({B, out}, MemTag::activations);
  Rng rng(100 + rank, 1);
  for (float& v : b.x.span()) v = rng.normal();
  for (float& v : b.y.span()) v = rng.normal();
  return b;
}

void backward(Model& model, const Batch& batch) {
  Tape tape;
  tape.backward(forward_loss(tape, model, batch));
}

// The reference: this rank's local gradients of `batch`, then each bucket ring-all-reduced and
// divided by N exactly as DDP does, but after backward, on the main thread.
std::vector<float> reference_gradients(Communicator& comm, Model& model, DDP& ddp,
                                       const Batch& batch) {
  model.zero_grad();
  ddp.set_require_sync(false);
  backward(model, batch);
  ddp.finalize_backward();  // without sync: does nothing
  ddp.set_require_sync(true);
  std::vector<float> ref(model.grads_memory.span().begin(), model.grads_memory.span().end());
  for (const Bucket& b : ddp.buckets()) {
    std::span<float> g = std::span<float>(ref).subspan(b.offset, b.size);
    ring_all_reduce(comm, g);
    for (float& x : g) x /= static_cast<float>(comm.world_size());
  }
  return ref;
}

}  // namespace

TEST_CASE("DDP gradients equal the ring all-reduce of every bucket, bit for bit", "[ddp]") {
  Communicator& comm = test_comm();
  // (cap, first cap) in MiB: several buckets, one bucket, one parameter per bucket.
  for (auto [cap, first] :
       {std::pair{0.1, 0.01}, std::pair{1000.0, 1000.0}, std::pair{0.00001, 1.0}}) {
    Model model({64, 96, 80, 8}, /*seed=*/3);
    DDP ddp(comm, model, TrainConfig{}, {.bucket_cap_mb = cap, .first_bucket_cap_mb = first});
    INFO("cap " << cap << " MiB: " << ddp.buckets().size() << " buckets");
    const Batch batch = rank_batch(12, 64, 8, comm.rank());
    const std::vector<float> ref = reference_gradients(comm, model, ddp, batch);
    model.zero_grad();
    backward(model, batch);
    ddp.finalize_backward();
    REQUIRE_SAME_BITS("the gradients (expected: each bucket ring-all-reduced, divided by N)", ref,
                      model.grads_memory.span(),
                      test::bucket_element(model, ddp.buckets(), comm.world_size()));
  }
}

TEST_CASE("gradients become ready in reverse registration order, layer by layer", "[ddp]") {
  Model model({16, 12, 12, 12, 4}, /*seed=*/1);  // params 0.w 0.b 2.w 2.b 4.w 4.b 6.w 6.b
  DDP ddp(test_comm(), model, TrainConfig{}, {});
  backward(model, rank_batch(4, 16, 4, test_comm().rank()));
  ddp.finalize_backward();
  INFO("rank " << test_comm().rank() << ": the order in which mark_ready saw the parameters");
  // Layers in reverse; within a layer, one backward op produces weight and bias together and
  // the tape fires their hooks in the op's order (weight, bias).
  REQUIRE(ddp.last_ready_order() == std::vector<int>{6, 7, 4, 5, 2, 3, 0, 1});
}

TEST_CASE("an evaluation forward (no backward) does not hold back the next backward's buckets",
          "[ddp]") {
  // evaluate() records a forward on a tape it drops: the tape must release its pending uses,
  // or every gradient-ready hook of the next backward would stay silent (a hang, or the
  // unused-parameter error naming every parameter).
  Model model({16, 12, 4}, /*seed=*/1);
  DDP ddp(test_comm(), model, TrainConfig{}, {});
  const Batch batch = rank_batch(4, 16, 4, test_comm().rank());
  {
    Tape eval_tape;
    forward_loss(eval_tape, model, batch);
  }
  backward(model, batch);
  REQUIRE_NOTHROW(ddp.finalize_backward());
  REQUIRE(ddp.last_ready_order() == std::vector<int>{2, 3, 0, 1});
}

TEST_CASE("the first bucket is launched while backward still runs", "[ddp][overlap]") {
  Communicator& comm = test_comm();
  // Bucket 0 holds only the last layer (first cap 10 KiB); three 1024-wide layers remain in
  // backward after it, tens of milliseconds of GEMMs, while its all-reduce runs.
  Model model({512, 1024, 1024, 1024, 16}, /*seed=*/2);
  Tracer tracer(true);
  trace_layers(tracer, model);
  DDP ddp(comm, model, TrainConfig{}, {.first_bucket_cap_mb = 0.01, .tracer = &tracer});
  REQUIRE(ddp.buckets().size() >= 2);
  REQUIRE(ddp.buckets()[0].params == std::vector<int>{7, 6});
  const Batch batch = rank_batch(256, 512, 16, comm.rank());
  sync_epoch(comm, tracer);
  backward(model, batch);
  ddp.finalize_backward();

  const TraceEvent *launch0 = nullptr, *reduce0 = nullptr, *last_backward = nullptr;
  const std::vector<TraceEvent> events = tracer.events();
  for (const TraceEvent& e : events) {
    if (e.name == "launch all_reduce bucket 0") launch0 = &e;
    if (e.name == "all_reduce bucket 0") reduce0 = &e;
    if (e.cat == "backward" &&
        (!last_backward || e.ts + e.dur > last_backward->ts + last_backward->dur))
      last_backward = &e;
  }
  REQUIRE(launch0);
  REQUIRE(reduce0);
  REQUIRE(last_backward);
  REQUIRE(last_backward->name == "backward 0 (Linear)");
  // Deterministic: the launch is recorded (main thread) before the first layer's backward ends.
  REQUIRE(launch0->seq < last_backward->seq);
  REQUIRE(launch0->track == Tracer::kMainTrack);
  REQUIRE(reduce0->track == Tracer::kCommTrack);
  // When the all-reduce itself starts is timing: it waits for the comm thread to be scheduled
  // and (with --check-collectives) for every rank to reach it, so with more ranks than cores a
  // rank can finish backward first. Reported, not asserted (a timed test flakes; the overlap
  // is measured in scripts/bench and shown by --trace).
  const double end = last_backward->ts + last_backward->dur;
  if (reduce0->ts >= end)
    WARN("rank " << comm.rank() << ": all_reduce bucket 0 started at " << reduce0->ts
                 << " us, after backward ended at " << end << " us (a busy machine)");
}

TEST_CASE("one synchronised backward moves the ring's bytes per bucket; no_sync moves none",
          "[ddp][no_sync]") {
  Communicator& comm = test_comm();
  const int N = comm.world_size(), r = comm.rank();
  Model model({64, 96, 80, 8}, /*seed=*/3);
  DDP ddp(comm, model, TrainConfig{}, {.bucket_cap_mb = 0.02, .first_bucket_cap_mb = 0.01});
  const Batch batch = rank_batch(12, 64, 8, r);
  model.zero_grad();
  comm.reset_counters();
  INFO("rank " << r << " of " << N << ", " << ddp.buckets().size() << " buckets");
  ddp.set_require_sync(false);
  for (int micro_step = 0; micro_step < 3; ++micro_step) {
    backward(model, batch);
    ddp.finalize_backward();
  }
  ddp.set_require_sync(true);
  {
    INFO("3 backwards inside no_sync: bytes and messages this rank sent (expected none)");
    REQUIRE(comm.training_traffic().bytes_sent == 0);
    REQUIRE(comm.training_traffic().messages_sent == 0);
  }
  backward(model, batch);  // the fourth micro-step communicates the accumulated sum
  ddp.finalize_backward();
  int64_t sent = 0, received = 0;
  for (const Bucket& b : ddp.buckets()) {
    sent += ring_reduce_scatter_sent(b.size, N, r) + ring_all_gather_sent(b.size, N, r);
    received += ring_reduce_scatter_received(b.size, N, r) + ring_all_gather_received(b.size, N, r);
  }
  INFO(
      "then 1 synchronised backward: bytes this rank sent and received (expected: the ring's, "
      "bucket by bucket, 4 bytes per element)");
  REQUIRE(comm.training_traffic().bytes_sent == 4 * sent);
  REQUIRE(comm.training_traffic().bytes_received == 4 * received);
  REQUIRE(comm.counters().at("ring_reduce_scatter").calls ==
          static_cast<int64_t>(ddp.buckets().size()));
}

TEST_CASE("no_sync accumulation then one synchronised backward equals the reference",
          "[ddp][no_sync]") {
  // K = 3 micro-steps, each on its own batch: the sum of the three local gradients, all-reduced.
  Communicator& comm = test_comm();
  Model model({64, 96, 80, 8}, /*seed=*/3);
  DDP ddp(comm, model, TrainConfig{}, {.bucket_cap_mb = 0.1, .first_bucket_cap_mb = 0.01});
  std::vector<Batch> batches;
  for (int k = 0; k < 3; ++k) batches.push_back(rank_batch(12, 64, 8, 10 * comm.rank() + k));
  model.zero_grad();
  ddp.set_require_sync(false);
  for (const Batch& b : batches) backward(model, b);
  ddp.set_require_sync(true);
  std::vector<float> ref(model.grads_memory.span().begin(), model.grads_memory.span().end());
  for (const Bucket& b : ddp.buckets()) {
    std::span<float> g = std::span<float>(ref).subspan(b.offset, b.size);
    ring_all_reduce(comm, g);
    for (float& x : g) x /= static_cast<float>(comm.world_size());
  }
  model.zero_grad();
  for (int k = 0; k < 3; ++k) {
    ddp.set_require_sync(k == 2);  // the last of 3 micro-steps sends
    backward(model, batches[k]);
    ddp.finalize_backward();
  }
  REQUIRE_SAME_BITS(
      "the gradients after 2 no_sync micro-steps and 1 synchronised one (expected: "
      "the sum of the 3 local gradients, all-reduced once, divided by N)",
      ref, model.grads_memory.span(),
      test::bucket_element(model, ddp.buckets(), comm.world_size()));
}

namespace {
// A forward that skips layer 2 (16 -> 16), so 2.weight and 2.bias get no gradient.
void backward_skipping_layer2(Model& model, const Batch& batch) {
  auto layers = model.linear_layers();  // 0, 2, 4
  Tape tape;
  Var h = relu(tape, linear(tape, make_var(batch.x), layers[0]->weight, layers[0]->bias));
  Var out = linear(tape, h, layers[2]->weight, layers[2]->bias);
  tape.backward(mse_loss(tape, out, batch.y));
}
}  // namespace

TEST_CASE("an unused parameter fails on every rank, naming it, instead of hanging",
          "[ddp][unused]") {
  Model model({8, 16, 16, 4}, /*seed=*/4);
  DDP ddp(test_comm(), model, TrainConfig{},
          {.bucket_cap_mb = 0.0001, .first_bucket_cap_mb = 0.0001});  // one per parameter
  model.zero_grad();
  backward_skipping_layer2(model, rank_batch(6, 8, 4, test_comm().rank()));
  REQUIRE_THROWS_WITH(ddp.finalize_backward(),
                      Contains("received no gradient in this backward: 2.weight, 2.bias") &&
                          Contains("--find-unused-parameters"));
  // The DDP is usable again afterwards: a normal backward synchronises.
  backward(model, rank_batch(6, 8, 4, test_comm().rank()));
  REQUIRE_NOTHROW(ddp.finalize_backward());
}

TEST_CASE("with find_unused_parameters an unused parameter counts as a zero gradient",
          "[ddp][unused]") {
  Communicator& comm = test_comm();
  Model model({8, 16, 16, 4}, /*seed=*/4);
  DDP ddp(comm, model, TrainConfig{},
          {.bucket_cap_mb = 0.0001, .first_bucket_cap_mb = 0.0001, .find_unused_parameters = true});
  const Batch batch = rank_batch(6, 8, 4, comm.rank());
  model.zero_grad();
  ddp.set_require_sync(false);
  backward_skipping_layer2(model, batch);
  ddp.set_require_sync(true);
  std::vector<float> ref(model.grads_memory.span().begin(), model.grads_memory.span().end());
  for (const Bucket& b : ddp.buckets()) {
    std::span<float> g = std::span<float>(ref).subspan(b.offset, b.size);
    ring_all_reduce(comm, g);
    for (float& x : g) x /= static_cast<float>(comm.world_size());
  }
  model.zero_grad();
  backward_skipping_layer2(model, batch);
  REQUIRE_NOTHROW(ddp.finalize_backward());
  REQUIRE_SAME_BITS("the gradients (expected: unused parameters count as zero)", ref,
                    model.grads_memory.span(),
                    test::bucket_element(model, ddp.buckets(), comm.world_size()));
  const Parameter& w2 = *model.parameters()[2];
  for (float g : w2.grad.span()) REQUIRE(g == 0.0f);
  // The unused ones were marked last, after every parameter that did get a gradient.
  REQUIRE(ddp.last_ready_order() == std::vector<int>{4, 5, 0, 1, 3, 2});
}

TEST_CASE("different bucket plans on different ranks: every rank fails with both plans",
          "[ddp][plan]") {
  Communicator& comm = test_comm();
  const std::vector<int64_t> sizes = {1000, 10, 1000, 10};
  const auto same = plan_buckets(sizes, 1 << 20, 1 << 20);
  REQUIRE_NOTHROW(check_bucket_plans_match(comm, same));
  if (comm.world_size() == 1) return;
  // Rank 1 uses a smaller cap: 2 buckets instead of 1.
  const auto mine = comm.rank() == 1 ? plan_buckets(sizes, 4040, 4040) : same;
  REQUIRE_THROWS_WITH(
      check_bucket_plans_match(comm, mine),
      Contains("rank 0: 1 buckets [2020 elements/4 params]") &&
          Contains("rank 1: 2 buckets [1010 elements/2 params, 1010 elements/2 params]"));
}

TEST_CASE("an error in a comm-thread job reaches the main thread", "[ddp][comm_thread]") {
  CommThread thread;
  int ran = 0;
  const uint64_t first = thread.submit([&] { ++ran; });
  thread.wait(first);
  REQUIRE(ran == 1);
  REQUIRE(thread.submit([] { throw std::runtime_error("ring failed"); }) == first + 1);
  REQUIRE_THROWS_WITH(thread.wait_all(), Contains("ring failed"));
  thread.submit([&] { ++ran; });  // still usable
  thread.wait_all();
  REQUIRE(ran == 2);
  REQUIRE(thread.idle());
}
