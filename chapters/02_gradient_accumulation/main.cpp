// Chapter 02: gradient accumulation — K micro-batches, one optimizer step.
//
//   build/bin/ch02_gradient_accumulation --epochs 5 --grad-accum-steps 4
//   build/bin/ch02_gradient_accumulation --model toy --epochs 2 --grad-accum-steps 4
//
// The global batch B is cut into K micro-batches of B/K. Backward accumulates (+=), so running
// K backwards before one optimizer step sums K gradients; scaling each micro-batch loss by 1/K
// turns that sum into the gradient of the full-batch mean: the same step as chapter 01 with
// 1/K of the activation memory.
#include <cstdio>

#include "common/atomic_file.hpp"
#include "common/check.hpp"
#include "common/config.hpp"
#include "common/metrics.hpp"
#include "common/safetensors.hpp"
#include "common/train.hpp"
#include "common/zero_memory.hpp"

using namespace ringzero;

// One optimizer step on global batch t, in K micro-steps. Returns the global batch's mean loss.
static double train_step(Model& model, Optimizer& optimizer, const Dataset& train,
                         const Sampler& sampler, int64_t t, const TrainConfig& config,
                         int64_t step) {
  const int64_t K = config.grad_accum_steps;
  model.zero_grad();  // once per optimizer step, not per micro-step: that is the whole trick
  double loss_sum = 0;
  for (int64_t micro_step = 0; micro_step < K; ++micro_step) {
    Batch batch = make_batch(train, sampler.chunk(t, micro_step, K));  // (B/K, in)
    Tape tape;
    Var loss = forward_loss(tape, model, batch);  // mean over the B/K samples
    loss_sum += loss->value[0];
    tape.backward(loss, 1.0f / K);  // (loss / K).backward(): grads += dloss/K
  }
  const double loss_value =
      loss_sum / K;                     // mean of equal-sized micro-batch means = full-batch mean
  check_finite_loss(loss_value, step);  // stop before a NaN reaches the weights
  if (config.clip_grad_norm > 0) clip_grad_norm(model.grads_memory.span(), config.clip_grad_norm);
  optimizer.step(model.params_memory.span(), model.grads_memory.span());
  return loss_value;
}

int main(int argc, char** argv) {
  CLI::App app{"RingZero chapter 02: gradient accumulation, on one process"};
  TrainConfig config;
  add_train_flags(app, config, /*with_grad_accum=*/true);
  if (int rc = parse_flags(app, argc, argv); rc >= 0) return rc;

  return run_main([&] {
    refuse_multi_process_launch("ch02_gradient_accumulation");  // one process: N copies would clash
    validate(config, /*world_size=*/1);
    check_output_path("--save-final", config.save_final);  // before training, not after it
    check_output_path("--metrics", config.metrics);
    TrainTestData data = load_data(config);
    std::unique_ptr<Model> model = build_model(config);
    Optimizer optimizer(config, parameter_sizes(*model));
    Sampler sampler(data.train.size, config.global_batch_size, config.seed, !config.no_shuffle);
    StepLogger logger(config.metrics, /*rank=*/0, config.log_every);
    const int64_t steps = total_steps(config, sampler.steps_per_epoch());
    print0("ch02_gradient_accumulation | model " + config.model + " | " +
           std::to_string(model->num_parameters()) + " parameters | global batch " +
           std::to_string(config.global_batch_size) + " = " +
           std::to_string(config.grad_accum_steps) + " x " +
           std::to_string(config.micro_batch_size(1)) + " | " + std::to_string(steps) + " steps");

    StepTimes times;
    double loss = 0, test_loss = 0, test_accuracy = -1;
    int64_t step = 0;
    for (int64_t epoch = 1; epoch <= config.epochs && step < steps; ++epoch) {
      sampler.set_epoch(epoch - 1);
      for (int64_t t = 0; t < sampler.steps_per_epoch() && step < steps; ++t) {
        Stopwatch watch;
        loss = train_step(*model, optimizer, data.train, sampler, t, config, ++step);
        times.add(watch.ms());
        logger.step(step, steps, epoch, loss, config.global_batch_size / (watch.ms() / 1e3),
                    watch.ms());
      }
      if (config.eval_every_epoch) {
        EvalSums e = evaluate(*model, data.test, 0, data.test.size);
        test_loss = e.loss_sum / e.count;
        test_accuracy = config.classification() ? e.correct / e.count : -1;
        logger.eval(epoch, test_loss, test_accuracy);
      }
    }

    if (!config.save_final.empty()) save_safetensors(config.save_final, state_dict(*model));
    const double psi = static_cast<double>(model->num_parameters());
    const nlohmann::json ledger = ledger_json();
    const StateBytes states = fp32_state_bytes(config.optimizer, config.momentum);
    print0(format_ledger({ledger}, "formula (one process, " + std::string(states.name) +
                                       "): " + full_copy_formula_text(states) + " = " +
                                       human_bytes(states.per_param() * psi) +
                                       " with Ψ = " + std::to_string(model->num_parameters())));
    logger.summary({{"chapter", "02_gradient_accumulation"},
                    {"world_size", 1},
                    {"steps", step},
                    {"final_loss", loss},
                    {"test_loss", test_loss},
                    {"test_accuracy", test_accuracy},
                    {"ms_per_step", times.median_ms()},
                    {"num_parameters", model->num_parameters()},
                    {"model_states_bytes_per_rank", ledger["model_states_peak"]},
                    {"bytes_sent_per_rank_per_step", 0},
                    {"ledger", {ledger}}});
    return 0;
  });
}
