// Chapter 08: ZeRO-3 — each rank keeps its shard of the parameters only, too.
//
//   mpirun -np 4 build/bin/ch08_zero3 --epochs 5
//   mpirun -np 2 build/bin/ch08_zero3 --model toy --explain-layers --trace zero3.json
//   mpirun -np 2 build/bin/ch08_zero3 --model toy --no-prefetch    # every collective waited for at
//   once
//
// Same training as chapter 07, the same numbers (bit for bit where the ring sums in the same
// order, layer_shard.hpp). What changes is that no rank holds the whole model any more
// (zero.hpp): each layer's parameters are all-gathered just before its forward and again
// before its backward, and freed after each; its gradient is reduce-scattered as soon as its
// backward ends; no all-gather after the step. The next layer's gather is posted while this
// one computes (prefetch). Model states fall to (4 + 4 + 8)Ψ/N per rank; the traffic grows
// to 3(N−1)/N·4Ψ per step, 1.5× chapter 07's: the parameters travel twice.
#include <cstdio>

#include "chapters/08_zero3/zero.hpp"
#include "common/atomic_file.hpp"
#include "common/check.hpp"
#include "common/data_check.hpp"
#include "common/finite_check.hpp"
#include "common/comm.hpp"
#include "common/config.hpp"
#include "common/dist.hpp"
#include "common/metrics.hpp"
#include "common/safetensors.hpp"
#include "common/trace.hpp"
#include "common/train.hpp"
#include "common/zero_memory.hpp"

using namespace ringzero;

// Tests only (--debug-desync-rank): this rank runs layer `name` once more than the others, as a
// branch on its own data would; the ZeRO's desync check must stop every rank.
static void run_layer_again(Model& model, const std::string& name) {
  for (Linear* layer : model.linear_layers())
    if (layer->name() == name) {
      Tape tape;  // dropped: a forward only
      (*layer)(tape, make_var(Tensor::zeros({1, layer->weight.shape()[1]}, MemTag::activations)));
      return;
    }
  RZ_CHECK(false, "--debug-desync-layer "
                      << name << " is not a Linear layer (0, 2, 4, ... as state_dict names them)");
}

// One optimizer step on global batch t: K micro-steps on this rank's share, each gathering
// every layer twice and reduce-scattering its gradient, then each rank's step on its shard.
// Returns the global batch's mean loss (on every rank).
static double train_step(Communicator& comm, Model& model, ZeRO& zero, Tracer& tracer,
                         const Dataset& train, const Sampler& sampler, int64_t t,
                         const TrainConfig& config, int64_t step,
                         std::pair<int, std::string> desync) {
  Tracer::Span span(tracer, "step " + std::to_string(step), "step");
  const int64_t K = config.grad_accum_steps;
  const int N = comm.world_size();
  zero.zero_grad();
  double loss_sum = 0;
  for (int64_t micro_step = 0; micro_step < K; ++micro_step) {
    Batch batch = make_batch(
        train, rank_micro_batch(sampler, t, comm.rank(), N, K, micro_step));  // (B/(N K), in)
    if (comm.rank() == desync.first && step == 2) run_layer_again(model, desync.second);
    Tape tape;
    Var loss =
        forward_loss(tape, model, batch);  // mean over this micro-batch; gathers layer by layer
    loss_sum += loss->value[0];
    tape.backward(loss, 1.0f / K);  // gathers again; each layer's gradient shard += its mean
  }
  zero.finalize_backward();  // nothing in flight, no layer gathered: only the shards
  const double loss_value = global_mean(comm, loss_sum / K);  // equal shares: mean of means
  check_finite_loss(comm, loss_sum / K, loss_value, step);  // all stop together; names the rank(s)

  Tracer::Span opt(tracer, "optimizer step", "optimizer");
  if (config.clip_grad_norm > 0)
    zero.clip_grad_norm(config.clip_grad_norm);  // global norm over the shards
  zero.step();  // each rank updates its shard; the next forward gathers it
  return loss_value;
}

int main(int argc, char** argv) {
  Communicator comm(argc, argv);  // outlives run_main, so a failure can still MPI_Abort every rank
  CLI::App app{
      "RingZero chapter 08: ZeRO-3, optimizer state, gradients and parameters sharded over ranks, "
      "under mpirun"};
  TrainConfig config;
  add_train_flags(app, config, /*with_grad_accum=*/true);
  ZeRO::Options zero_options;
  MemoryCalculatorFlags calculator;
  std::string optimizer_state_path;
  std::string trace_path;
  int64_t trace_steps = 5;
  bool explain = false, no_prefetch = false;
  std::pair<int, std::string> desync = {-1, ""};
  app.add_option("--collectives", zero_options.collectives,
                 "ring (ours, chapter 04) | mpi (MPI_Reduce_scatter_block + MPI_Allgather)")
      ->check(CLI::IsMember({"ring", "mpi"}));
  app.add_flag("--no-prefetch", no_prefetch,
               "post each all-gather only when its layer needs it; wait for every collective");
  app.add_flag("--explain-layers", explain,
               "print the layer plan (elements, padding, shard size per layer)");
  app.add_option("--debug-desync-rank", desync.first,
                 "tests only: this rank runs a layer once more in step 2");
  app.add_option("--debug-desync-layer", desync.second,
                 "tests only: the layer it runs again (0, 2, ...)");
  app.add_option("--trace", trace_path,
                 "write a Chrome trace (ui.perfetto.dev) of the first --trace-steps steps");
  app.add_option("--trace-steps", trace_steps, "optimizer steps to trace")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--save-optimizer-state", optimizer_state_path,
                 "write AdamW's state, gathered, to a safetensors file");
  add_memory_calculator_flags(app, calculator);
  if (int rc = parse_flags_on_every_rank(comm, app, argc, argv); rc >= 0) return rc;

  return run_main([&] {
    verify_same_flags(comm, app,
                      {seed_checked_elsewhere(config), "init-from",
                       "data-dir"});  // those two: the parameter check
    if (calculator.enabled) return print0(memory_calculator(calculator)), 0;
    const int N = comm.world_size();
    validate(config, N);
    if (comm.rank() == 0) {                                  // the rank that writes them
      check_output_path("--save-final", config.save_final);  // before training, not after it
      check_output_path("--metrics", config.metrics);
      check_output_path("--trace", trace_path);
      check_output_path("--save-optimizer-state", optimizer_state_path);
    }
    TrainTestData data = load_data(config);
    std::unique_ptr<Model> model = build_model(config);
    broadcast_and_verify_parameters(comm, *model);  // same start on every rank, or stop here
    verify_same_data(comm, data);  // same samples and content on every rank, or stop here
    const int64_t psi = model->num_parameters();  // read it now: the ZeRO takes the model's buffers
    Tracer tracer;
    zero_options.tracer = &tracer;
    zero_options.prefetch = !no_prefetch;
    ZeRO zero(comm, *model, config,
              zero_options);      // layer shards, this rank's optimizers; the model's buffers go
    Ledger::get().reset_peaks();  // the steady state, not the moment the parameters existed in full
    if (explain) print0(explain_layer_shards(zero.layout(), N));
    if (!trace_path.empty()) sync_epoch(comm, tracer);
    Sampler sampler(data.train.size, config.global_batch_size, config.seed, !config.no_shuffle);
    StepLogger logger(config.metrics, comm.rank(), config.log_every);
    const int64_t steps = total_steps(config, sampler.steps_per_epoch());
    print0("ch08_zero3 | model " + config.model + " | " + std::to_string(psi) +
           " parameters | global batch " + std::to_string(config.global_batch_size) + " = " +
           std::to_string(N) + " ranks x " + std::to_string(config.grad_accum_steps) + " x " +
           std::to_string(config.micro_batch_size(N)) + " | " + std::to_string(steps) +
           " steps | " + std::to_string(zero.layout().layers.size()) + " layers | prefetch " +
           (no_prefetch ? "off" : "on") + " | collectives " + zero_options.collectives);
    const nlohmann::json startup = finish_setup(comm);

    StepTimes times;
    double loss = 0, test_loss = 0, test_accuracy = -1;
    int64_t step = 0;
    for (int64_t epoch = 1; epoch <= config.epochs && step < steps; ++epoch) {
      sampler.set_epoch(epoch - 1);
      for (int64_t t = 0; t < sampler.steps_per_epoch() && step < steps; ++t) {
        Stopwatch watch;
        tracer.set_enabled(!trace_path.empty() && step < trace_steps);
        loss =
            train_step(comm, *model, zero, tracer, data.train, sampler, t, config, ++step, desync);
        tracer.set_enabled(false);
        times.add(watch.ms());
        logger.step(step, steps, epoch, loss, config.global_batch_size / (watch.ms() / 1e3),
                    watch.ms());
      }
      if (config.eval_every_epoch) {
        EvalResult e = zero.evaluate(data.test);  // every rank runs as many forwards: each gathers
        test_loss = e.test_loss;
        test_accuracy = e.test_accuracy;
        logger.eval(epoch, test_loss, test_accuracy);
      }
    }

    if (!trace_path.empty()) write_chrome_trace(comm, tracer, trace_path);
    const TrafficTheory theory =
        zero.traffic_theory(config.grad_accum_steps);  // 2 all-gathers + 1 reduce-scatter per layer
    nlohmann::json summary = end_of_run_report(comm, step, startup, zero.ledger_formula(), theory);
    if (comm.rank() == 0) {
      summary.update({{"chapter", "08_zero3"},
                      {"zero_stage", 3},
                      {"world_size", N},
                      {"steps", step},
                      {"final_loss", loss},
                      {"test_loss", test_loss},
                      {"test_accuracy", test_accuracy},
                      {"ms_per_step", times.median_ms()},
                      {"num_parameters", psi},
                      {"collectives", zero_options.collectives},
                      {"layers", zero.layout().layers.size()},
                      {"prefetch", !no_prefetch},
                      {"model_states_exact_bytes", zero.model_states_bytes()},
                      {"padding", N * zero.layout().shard_total - psi},
                      {"layers_in_flight_bytes", zero.layers_in_flight_bytes()},
                      {"theory_bytes_sent_per_rank_per_step", theory.bytes_sent}});
      logger.summary(summary);
    }
    if (!config.save_final.empty()) {  // after the report: its all-gathers are not training traffic
      auto state = zero.state_dict();
      if (comm.rank() == 0) save_safetensors(config.save_final, state);
    }
    if (!optimizer_state_path.empty()) {
      auto state = zero.optimizer_state_dict();
      if (comm.rank() == 0) save_safetensors(optimizer_state_path, state);
    }
    return 0;
  });
}
