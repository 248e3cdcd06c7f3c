// Chapter 06: ZeRO-1 — each rank keeps the optimizer state of its shard only.
//
//   mpirun -np 4 build/bin/ch06_zero1 --epochs 5
//   mpirun -np 2 build/bin/ch06_zero1 --model toy --trace zero1.json
//   build/bin/ch06_zero1 --memory-calculator --params 7e9 --world-size 8   # the seeds' table
//
// Same training as chapter 05, same buckets, same bytes on the wire, bit for bit the same
// numbers. What changes is who updates what: chapter 05's all-reduce is split into its two
// halves (zero.hpp). The reduce-scatter leaves each rank the summed gradient of its shard
// (shard.hpp) of every bucket; each rank's optimizer updates only that shard, so Adam's state
// shrinks to 8Ψ/N per rank; an all-gather then gives every rank the updated parameters.
#include <cstdio>
#include <optional>

#include "chapters/06_zero1/zero.hpp"
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

// One optimizer step on global batch t: K micro-steps on this rank's share, the last one's
// backward reduce-scattering bucket after bucket, each rank's step on its shard, and the
// all-gather of the parameters. Returns the global batch's mean loss (on every rank).
static double train_step(Communicator& comm, Model& model, ZeRO& zero, Tracer& tracer,
                         const Dataset& train, const Sampler& sampler, int64_t t,
                         const TrainConfig& config, int64_t step) {
  Tracer::Span span(tracer, "step " + std::to_string(step), "step");
  const int64_t K = config.grad_accum_steps;
  const int N = comm.world_size();
  zero.zero_grad();
  double loss_sum = 0;
  for (int64_t micro_step = 0; micro_step < K; ++micro_step) {
    Batch batch = make_batch(
        train, rank_micro_batch(sampler, t, comm.rank(), N, K, micro_step));  // (B/(N K), in)
    std::optional<ZeRO::NoSync> no_sync;  // only the last micro-step's backward communicates
    if (micro_step < K - 1) no_sync.emplace(zero);
    Tape tape;
    Var loss = forward_loss(tape, model, batch);  // mean over this micro-batch
    loss_sum += loss->value[0];
    tape.backward(loss, 1.0f / K);  // grads += dloss/K; full buckets start their reduce-scatter
  }
  {
    Tracer::Span wait(tracer, "finalize_backward (wait for buckets)", "ddp");
    zero.finalize_backward();  // every bucket reduce-scattered: this rank's shard holds the mean
  }
  const double loss_value = global_mean(comm, loss_sum / K);  // equal shares: mean of means
  check_finite_loss(comm, loss_sum / K, loss_value, step);  // all stop together; names the rank(s)

  Tracer::Span opt(tracer, "optimizer step + all_gather", "optimizer");
  if (config.clip_grad_norm > 0)
    zero.clip_grad_norm(config.clip_grad_norm);  // global norm over the shards
  zero.step();  // each rank updates its shard, then every rank gathers every shard
  return loss_value;
}

int main(int argc, char** argv) {
  Communicator comm(argc, argv);  // outlives run_main, so a failure can still MPI_Abort every rank
  CLI::App app{"RingZero chapter 06: ZeRO-1, optimizer state sharded over ranks, under mpirun"};
  TrainConfig config;
  add_train_flags(app, config, /*with_grad_accum=*/true);
  ZeRO::Options zero_options;
  MemoryCalculatorFlags calculator;
  std::string optimizer_state_path;
  std::string trace_path;
  int64_t trace_steps = 5;
  bool explain = false;
  app.add_option("--collectives", zero_options.collectives,
                 "ring (ours, chapter 04) | mpi (MPI_Reduce_scatter_block + MPI_Allgather)")
      ->check(CLI::IsMember({"ring", "mpi"}));
  app.add_option("--bucket-cap-mb", zero_options.bucket_cap_mb,
                 "bucket size limit in MiB (PyTorch's default: 25)");
  app.add_option("--first-bucket-cap-mb", zero_options.first_bucket_cap_mb,
                 "the first bucket's limit in MiB (1)");
  app.add_flag("--find-unused-parameters", zero_options.find_unused_parameters,
               "count a parameter that gets no gradient as a zero gradient instead of failing");
  app.add_flag("--explain-buckets", explain,
               "print the bucket plan (buckets, parameters, elements, bytes)");
  app.add_option("--trace", trace_path,
                 "write a Chrome trace (ui.perfetto.dev) of the first --trace-steps steps");
  app.add_option("--trace-steps", trace_steps, "optimizer steps to trace")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--save-optimizer-state", optimizer_state_path,
                 "write AdamW's state, gathered, to a safetensors file");
  add_memory_calculator_flags(app, calculator);
  if (int rc = parse_flags_on_every_rank(comm, app, argc, argv); rc >= 0) return rc;

  return run_main([&] {
    // The same flags on every rank; seeds and bucket caps are checked by what they change.
    verify_same_flags(comm, app,
                      {seed_checked_elsewhere(config), "init-from", "data-dir", "bucket-cap-mb",
                       "first-bucket-cap-mb"});
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
    ZeRO zero(comm, *model, config,
              zero_options);      // buckets, shards, this rank's optimizer; parameters move in
    Ledger::get().reset_peaks();  // the steady state, not the moment the parameters existed twice
    if (explain)
      print0(explain_buckets(zero.buckets(), *model, zero_options.bucket_cap_mb,
                             zero_options.first_bucket_cap_mb));
    if (!trace_path.empty()) trace_layers(tracer, *model), sync_epoch(comm, tracer);
    Sampler sampler(data.train.size, config.global_batch_size, config.seed, !config.no_shuffle);
    StepLogger logger(config.metrics, comm.rank(), config.log_every);
    const int64_t steps = total_steps(config, sampler.steps_per_epoch());
    print0("ch06_zero1 | model " + config.model + " | " + std::to_string(psi) +
           " parameters | global batch " + std::to_string(config.global_batch_size) + " = " +
           std::to_string(N) + " ranks x " + std::to_string(config.grad_accum_steps) + " x " +
           std::to_string(config.micro_batch_size(N)) + " | " + std::to_string(steps) +
           " steps | " + std::to_string(zero.buckets().size()) + " buckets | collectives " +
           zero_options.collectives);
    const nlohmann::json startup = finish_setup(comm);

    StepTimes times;
    double loss = 0, test_loss = 0, test_accuracy = -1;
    int64_t step = 0;
    for (int64_t epoch = 1; epoch <= config.epochs && step < steps; ++epoch) {
      sampler.set_epoch(epoch - 1);
      for (int64_t t = 0; t < sampler.steps_per_epoch() && step < steps; ++t) {
        Stopwatch watch;
        tracer.set_enabled(!trace_path.empty() && step < trace_steps);
        loss = train_step(comm, *model, zero, tracer, data.train, sampler, t, config, ++step);
        tracer.set_enabled(false);
        times.add(watch.ms());
        logger.step(step, steps, epoch, loss, config.global_batch_size / (watch.ms() / 1e3),
                    watch.ms());
      }
      if (config.eval_every_epoch) {
        EvalResult e = evaluate_distributed(comm, *model, data.test);
        test_loss = e.test_loss;
        test_accuracy = e.test_accuracy;
        logger.eval(epoch, test_loss, test_accuracy);
      }
    }

    if (!config.save_final.empty() && comm.rank() == 0)
      save_safetensors(config.save_final, state_dict(*model));
    if (!trace_path.empty()) write_chrome_trace(comm, tracer, trace_path);
    const TrafficTheory theory =
        zero.traffic_theory();  // reduce-scatter + all-gather per padded bucket
    nlohmann::json summary = end_of_run_report(comm, step, startup, zero.ledger_formula(), theory);
    if (comm.rank() == 0) {
      summary.update({{"chapter", "06_zero1"},
                      {"zero_stage", 1},
                      {"world_size", N},
                      {"steps", step},
                      {"final_loss", loss},
                      {"test_loss", test_loss},
                      {"test_accuracy", test_accuracy},
                      {"ms_per_step", times.median_ms()},
                      {"num_parameters", psi},
                      {"collectives", zero_options.collectives},
                      {"buckets", zero.buckets().size()},
                      {"model_states_exact_bytes", zero.model_states_bytes()},
                      {"padding", zero.layout().padding_total},
                      {"theory_bytes_sent_per_rank_per_step", theory.bytes_sent}});
      logger.summary(summary);
    }
    if (!optimizer_state_path
             .empty()) {  // after the report: its all-gathers are not training traffic
      auto state = zero.optimizer_state_dict();
      if (comm.rank() == 0) save_safetensors(optimizer_state_path, state);
    }
    return 0;
  });
}
