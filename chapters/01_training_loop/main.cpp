// Chapter 01: the training loop — forward, loss, backward, optimizer step, zero grad.
//
//   build/bin/ch01_training_loop --epochs 5
//   build/bin/ch01_training_loop --model toy --epochs 2      # the seeds' ToyModel, synthetic data
//
// One process, one model, one optimizer. Every later chapter must reproduce the numbers this
// loop prints; the lesson is the loop body in train_step().
#include <cstdio>

#include "common/atomic_file.hpp"
#include "common/check.hpp"
#include "common/config.hpp"
#include "common/metrics.hpp"
#include "common/safetensors.hpp"
#include "common/train.hpp"
#include "common/zero_memory.hpp"

using namespace ringzero;

// One optimizer step on one batch. Returns the batch's mean loss.
static double train_step(Model& model, Optimizer& optimizer, const Batch& batch,
                         const TrainConfig& config, int64_t step) {
  model.zero_grad();                            // gradients accumulate (+=), so start from zero
  Tape tape;                                    // records what forward did, for backward
  Var loss = forward_loss(tape, model, batch);  // (B, in) -> (B, out) -> scalar
  const double loss_value = loss->value[0];
  check_finite_loss(loss_value, step);  // stop before a NaN reaches the weights
  tape.backward(loss);                  // d loss / d every parameter, into grads_memory
  if (config.clip_grad_norm > 0) clip_grad_norm(model.grads_memory.span(), config.clip_grad_norm);
  optimizer.step(model.params_memory.span(), model.grads_memory.span());
  return loss_value;
}

int main(int argc, char** argv) {
  CLI::App app{"RingZero chapter 01: the training loop, on one process"};
  TrainConfig config;
  add_train_flags(app, config, /*with_grad_accum=*/false);
  if (int rc = parse_flags(app, argc, argv); rc >= 0) return rc;

  return run_main([&] {
    refuse_multi_process_launch("ch01_training_loop");  // one process: N copies would clash
    validate(config, /*world_size=*/1);
    check_output_path("--save-final", config.save_final);  // before training, not after it
    check_output_path("--metrics", config.metrics);
    TrainTestData data = load_data(config);
    std::unique_ptr<Model> model = build_model(config);
    Optimizer optimizer(config, parameter_sizes(*model));
    Sampler sampler(data.train.size, config.global_batch_size, config.seed, !config.no_shuffle);
    StepLogger logger(config.metrics, /*rank=*/0, config.log_every);
    const int64_t steps = total_steps(config, sampler.steps_per_epoch());
    print0("ch01_training_loop | model " + config.model + " | " +
           std::to_string(model->num_parameters()) + " parameters | global batch " +
           std::to_string(config.global_batch_size) + " | " + std::to_string(steps) + " steps");

    StepTimes times;
    double loss = 0, test_loss = 0, test_accuracy = -1;
    int64_t step = 0;
    for (int64_t epoch = 1; epoch <= config.epochs && step < steps; ++epoch) {
      sampler.set_epoch(epoch - 1);
      for (int64_t t = 0; t < sampler.steps_per_epoch() && step < steps; ++t) {
        Stopwatch watch;
        Batch batch = make_batch(data.train, sampler.global_batch(t));
        loss = train_step(*model, optimizer, batch, config, ++step);
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
    logger.summary({{"chapter", "01_training_loop"},
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
