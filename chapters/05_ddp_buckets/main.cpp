// Chapter 05: DDP — gradient buckets all-reduced during backward, and no_sync.
//
//   mpirun -np 4 build/bin/ch05_ddp_buckets --epochs 5
//   mpirun -np 2 build/bin/ch05_ddp_buckets --model toy --explain-buckets --trace ddp.json
//   mpirun -np 4 build/bin/ch05_ddp_buckets --grad-accum-steps 4   # communicates on micro-step 4
//   only
//
// Same training as chapter 04, same ring, same traffic; what changes is WHEN the gradients
// travel. DDP (ddp.hpp) groups them into buckets in reverse layer order (buckets.hpp) and
// all-reduces each bucket on a communication thread as soon as backward has produced its last
// gradient, while backward goes on with the earlier layers. --trace writes the timeline that
// shows it (open it in ui.perfetto.dev, or see the chapter README).
#include <cstdio>
#include <optional>

#include "chapters/05_ddp_buckets/ddp.hpp"
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
// backward all-reducing bucket after bucket, and the same optimizer step on every rank.
// Returns the global batch's mean loss (on every rank).
static double train_step(Communicator& comm, Model& model, Optimizer& optimizer, DDP& ddp,
                         Tracer& tracer, const Dataset& train, const Sampler& sampler, int64_t t,
                         const TrainConfig& config, int64_t step) {
  Tracer::Span span(tracer, "step " + std::to_string(step), "step");
  const int64_t K = config.grad_accum_steps;
  const int N = comm.world_size();
  model.zero_grad();
  double loss_sum = 0;
  for (int64_t micro_step = 0; micro_step < K; ++micro_step) {
    Batch batch = make_batch(
        train, rank_micro_batch(sampler, t, comm.rank(), N, K, micro_step));  // (B/(N K), in)
    std::optional<DDP::NoSync> no_sync;  // only the last micro-step's backward communicates
    if (micro_step < K - 1) no_sync.emplace(ddp);
    Tape tape;
    Var loss = forward_loss(tape, model, batch);  // mean over this micro-batch
    loss_sum += loss->value[0];
    tape.backward(loss, 1.0f / K);  // grads += dloss/K; full buckets start their all-reduce
  }
  {
    Tracer::Span wait(tracer, "finalize_backward (wait for buckets)", "ddp");
    ddp.finalize_backward();  // every bucket all-reduced and / N; MPI is this thread's again
  }
  const double loss_value = global_mean(comm, loss_sum / K);  // equal shares: mean of means
  check_finite_loss(comm, loss_sum / K, loss_value, step);  // all stop together; names the rank(s)

  Tracer::Span opt(tracer, "optimizer step", "optimizer");
  if (config.clip_grad_norm > 0) clip_grad_norm(model.grads_memory.span(), config.clip_grad_norm);
  optimizer.step(model.params_memory.span(), model.grads_memory.span());  // same step everywhere
  return loss_value;
}

int main(int argc, char** argv) {
  Communicator comm(argc, argv);  // outlives run_main, so a failure can still MPI_Abort every rank
  CLI::App app{
      "RingZero chapter 05: DDP with gradient buckets overlapped with backward, under mpirun"};
  TrainConfig config;
  add_train_flags(app, config, /*with_grad_accum=*/true);
  DDP::Options ddp_options;
  std::string trace_path;
  int64_t trace_steps = 5;
  bool explain = false;
  app.add_option("--collectives", ddp_options.collectives,
                 "ring (ours, chapter 04) | mpi (MPI_Allreduce)")
      ->check(CLI::IsMember({"ring", "mpi"}));
  app.add_option("--bucket-cap-mb", ddp_options.bucket_cap_mb,
                 "bucket size limit in MiB (PyTorch's default: 25)");
  app.add_option("--first-bucket-cap-mb", ddp_options.first_bucket_cap_mb,
                 "the first bucket's limit in MiB (1)");
  app.add_flag("--find-unused-parameters", ddp_options.find_unused_parameters,
               "count a parameter that gets no gradient as a zero gradient instead of failing");
  app.add_flag("--explain-buckets", explain,
               "print the bucket plan (buckets, parameters, elements, bytes)");
  app.add_option("--trace", trace_path,
                 "write a Chrome trace (ui.perfetto.dev) of the first --trace-steps steps");
  app.add_option("--trace-steps", trace_steps, "optimizer steps to trace")
      ->check(CLI::Range(1, 1000000));
  if (int rc = parse_flags_on_every_rank(comm, app, argc, argv); rc >= 0) return rc;

  return run_main([&] {
    // The same flags on every rank; seeds and bucket caps are checked by what they change.
    verify_same_flags(comm, app,
                      {seed_checked_elsewhere(config), "init-from", "data-dir", "bucket-cap-mb",
                       "first-bucket-cap-mb"});
    const int N = comm.world_size();
    validate(config, N);
    if (comm.rank() == 0) {                                  // the rank that writes them
      check_output_path("--save-final", config.save_final);  // before training, not after it
      check_output_path("--metrics", config.metrics);
      check_output_path("--trace", trace_path);
    }
    TrainTestData data = load_data(config);
    std::unique_ptr<Model> model = build_model(config);
    broadcast_and_verify_parameters(comm, *model);  // same start on every rank, or stop here
    verify_same_data(comm, data);  // same samples and content on every rank, or stop here
    Optimizer optimizer(config, parameter_sizes(*model));  // every rank: replicated optimizer state
    Tracer tracer;
    ddp_options.tracer = &tracer;
    DDP ddp(comm, *model, ddp_options);  // plans the buckets, checks every rank has the same plan
    if (explain) print0(ddp.explain());
    if (!trace_path.empty()) trace_layers(tracer, *model), sync_epoch(comm, tracer);
    Sampler sampler(data.train.size, config.global_batch_size, config.seed, !config.no_shuffle);
    StepLogger logger(config.metrics, comm.rank(), config.log_every);
    const int64_t steps = total_steps(config, sampler.steps_per_epoch());
    print0("ch05_ddp_buckets | model " + config.model + " | " +
           std::to_string(model->num_parameters()) + " parameters | global batch " +
           std::to_string(config.global_batch_size) + " = " + std::to_string(N) + " ranks x " +
           std::to_string(config.grad_accum_steps) + " x " +
           std::to_string(config.micro_batch_size(N)) + " | " + std::to_string(steps) +
           " steps | " + std::to_string(ddp.buckets().size()) + " buckets | collectives " +
           ddp_options.collectives);
    const nlohmann::json startup = finish_setup(comm);

    StepTimes times;
    double loss = 0, test_loss = 0, test_accuracy = -1;
    int64_t step = 0;
    for (int64_t epoch = 1; epoch <= config.epochs && step < steps; ++epoch) {
      sampler.set_epoch(epoch - 1);
      for (int64_t t = 0; t < sampler.steps_per_epoch() && step < steps; ++t) {
        Stopwatch watch;
        tracer.set_enabled(!trace_path.empty() && step < trace_steps);
        loss = train_step(comm, *model, optimizer, ddp, tracer, data.train, sampler, t, config,
                          ++step);
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
    const int64_t psi = model->num_parameters();
    if (!trace_path.empty()) write_chrome_trace(comm, tracer, trace_path);
    const std::string collectives = ddp_options.collectives;
    TrafficTheory theory =
        ring_all_reduce_traffic(bucket_sizes(ddp.buckets()), N);  // chapter 04's bytes
    theory.formula += "; counted per bucket here: " + std::to_string(ddp.buckets().size()) +
                      " all-reduces instead of " + std::to_string(model->parameters().size()) +
                      ", the same bytes";
    if (collectives == "mpi")  // MPI does not report its wire traffic, only what we hand it
      theory = {std::vector<int64_t>(N, 4 * psi), std::vector<int64_t>(N, 4 * psi),
                "MPI_Allreduce: the counters show the Ψ·4 = " + human_bytes(4.0 * psi) +
                    " handed to MPI per step"};
    const StateBytes states = fp32_state_bytes(config.optimizer, config.momentum);
    const std::string ledger_formula = "formula (" + std::string(states.name) +
                                       ", every rank): " + full_copy_formula_text(states) + " = " +
                                       human_bytes(states.per_param() * psi) +
                                       "; comm_buffers: one chunk of the largest bucket";
    nlohmann::json summary = end_of_run_report(comm, step, startup, ledger_formula, theory);
    if (comm.rank() == 0) {
      summary.update({{"chapter", "05_ddp_buckets"},
                      {"world_size", N},
                      {"steps", step},
                      {"final_loss", loss},
                      {"test_loss", test_loss},
                      {"test_accuracy", test_accuracy},
                      {"ms_per_step", times.median_ms()},
                      {"num_parameters", psi},
                      {"collectives", collectives},
                      {"buckets", ddp.buckets().size()}});
      logger.summary(summary);
    }
    return 0;
  });
}
