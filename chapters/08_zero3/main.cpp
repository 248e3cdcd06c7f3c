// Chapter 08: ZeRO-3 — parameters, gradients and optimizer state all sharded; each layer's
// parameters gathered just in time, with prefetch.
//
//   mpirun -np 4 build/bin/ch08_zero3 --epochs 5
//   mpirun -np 2 build/bin/ch08_zero3 --model toy --trace zero3.json
//   mpirun -np 2 build/bin/ch08_zero3 --model toy --no-prefetch      # every collective waited for at once
#include <cstdio>
#include <optional>

#include "chapters/08_zero3/zero.hpp"
#include "common/check.hpp"
#include "common/comm.hpp"
#include "common/config.hpp"
#include "common/dist.hpp"
#include "common/metrics.hpp"
#include "common/safetensors.hpp"
#include "common/trace.hpp"
#include "common/train.hpp"

using namespace ringzero;

static double train_step(Communicator& comm, Model& model, ZeRO& zero, Tracer& tracer, const Dataset& train,
                         const Sampler& sampler, int64_t t, const TrainConfig& config, int64_t step,
                         int desync_rank, int desync_layer) {
  Tracer::Span span(tracer, "step " + std::to_string(step), "step");
  const int64_t K = config.grad_accum_steps;
  const int N = comm.world_size();
  zero.zero_grad();
  double loss_sum = 0;
  for (int64_t micro_step = 0; micro_step < K; ++micro_step) {
    Batch batch = make_batch(train, rank_micro_batch(sampler, t, comm.rank(), N, K, micro_step));  // (B/(N K), in)
    if (comm.rank() == desync_rank && step == 2) {  // test only: this rank runs one layer once more
      Linear& layer = *model.linear_layers().at(desync_layer);
      Tape scratch;
      layer(scratch, make_var(Tensor::zeros({1, layer.weight.shape()[1]}, MemTag::activations)));
    }
    Tape tape;
    Var loss = forward_loss(tape, model, batch);
    loss_sum += loss->value[0];
    tape.backward(loss, 1.0f / K);
  }
  zero.finalize_backward();
  const double loss_value = global_mean(comm, loss_sum / K);
  check_finite_loss(loss_value, step);
  Tracer::Span opt(tracer, "optimizer step", "optimizer");
  if (config.clip_grad_norm > 0) zero.clip_grad_norm(config.clip_grad_norm);
  zero.step();
  return loss_value;
}

int main(int argc, char** argv) {
  Communicator comm(argc, argv);
  CLI::App app{"RingZero chapter 08: ZeRO-3, under mpirun"};
  TrainConfig config;
  add_train_flags(app, config, /*with_grad_accum=*/true);
  ZeRO::Options zero_options;
  std::string trace_path;
  int64_t trace_steps = 5;
  bool no_prefetch = false;
  int desync_rank = -1, desync_layer = 0;
  app.add_flag("--no-prefetch", no_prefetch, "wait for every collective as soon as it is posted");
  app.add_option("--trace", trace_path, "write a Chrome trace of the first --trace-steps steps");
  app.add_option("--trace-steps", trace_steps, "optimizer steps to trace");
  app.add_option("--debug-desync-rank", desync_rank, "test only");
  app.add_option("--debug-desync-layer", desync_layer, "test only");
  if (int rc = parse_flags(app, argc, argv); rc >= 0) return rc;

  return run_main([&] {
    const int N = comm.world_size();
    validate(config, N);
    TrainTestData data = load_data(config);
    std::unique_ptr<Model> model = build_model(config);
    broadcast_and_verify_parameters(comm, *model);
    const int64_t psi = model->num_parameters();
    Tracer tracer;
    zero_options.tracer = &tracer;
    zero_options.prefetch = !no_prefetch;
    ZeRO zero(comm, *model, config, zero_options);
    if (!trace_path.empty()) sync_epoch(comm, tracer);
    Ledger::get().reset_peaks();
    Sampler sampler(data.train.size, config.global_batch_size, config.seed, !config.no_shuffle);
    StepLogger logger(config.metrics, comm.rank(), config.log_every);
    const int64_t steps = total_steps(config, sampler.steps_per_epoch());
    print0("ch08_zero3 | " + std::to_string(psi) + " parameters | " + std::to_string(steps) + " steps");
    const nlohmann::json startup = finish_setup(comm);

    StepTimes times;
    double loss = 0, test_loss = 0, test_accuracy = -1;
    int64_t step = 0;
    for (int64_t epoch = 1; epoch <= config.epochs && step < steps; ++epoch) {
      sampler.set_epoch(epoch - 1);
      for (int64_t t = 0; t < sampler.steps_per_epoch() && step < steps; ++t) {
        Stopwatch watch;
        tracer.set_enabled(!trace_path.empty() && step < trace_steps);
        loss = train_step(comm, *model, zero, tracer, data.train, sampler, t, config, ++step, desync_rank, desync_layer);
        tracer.set_enabled(false);
        times.add(watch.ms());
        logger.step(step, steps, epoch, loss, config.global_batch_size / (watch.ms() / 1e3), watch.ms());
      }
      if (config.eval_every_epoch) {
        EvalResult e = zero.evaluate(data.test);
        test_loss = e.test_loss;
        test_accuracy = e.test_accuracy;
        logger.eval(epoch, test_loss, test_accuracy);
      }
    }
    if (!trace_path.empty()) write_chrome_trace(comm, tracer, trace_path);
    const TrafficTheory theory = zero.traffic_theory(config.grad_accum_steps);
    nlohmann::json summary = end_of_run_report(comm, step, startup, zero.ledger_formula(), theory);
    if (comm.rank() == 0) {
      summary.update({{"chapter", "08_zero3"}, {"world_size", N}, {"steps", step}, {"final_loss", loss},
                      {"test_loss", test_loss}, {"test_accuracy", test_accuracy},
                      {"ms_per_step", times.median_ms()}, {"num_parameters", psi}});
      logger.summary(summary);
    }
    if (!config.save_final.empty()) {
      auto state = zero.state_dict();
      if (comm.rank() == 0) save_safetensors(config.save_final, state);
    }
    return 0;
  });
}
