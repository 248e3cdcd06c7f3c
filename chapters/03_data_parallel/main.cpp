// Chapter 03: data parallel with a central reducer — N processes, one optimizer on rank 0.
//
//   mpirun -np 4 build/bin/ch03_data_parallel --epochs 5
//   mpirun -np 4 build/bin/ch03_data_parallel --model toy --epochs 2
//
// Each rank trains on its 1/N of every global batch (K micro-steps each, as in chapter 02).
// Rank 0 collects every rank's gradients, averages them, steps the only optimizer and sends the
// new parameters back (central_reducer.hpp). The numbers match chapter 02 with K = N; rank 0's
// traffic, printed at the end, grows with N.
#include <cstdio>
#include <optional>

#include "chapters/03_data_parallel/central_reducer.hpp"
#include "common/atomic_file.hpp"
#include "common/check.hpp"
#include "common/data_check.hpp"
#include "common/finite_check.hpp"
#include "common/comm.hpp"
#include "common/config.hpp"
#include "common/dist.hpp"
#include "common/metrics.hpp"
#include "common/safetensors.hpp"
#include "common/train.hpp"
#include "common/zero_memory.hpp"

using namespace ringzero;

// One optimizer step on global batch t: K micro-steps on this rank's share, then the central
// reducer. Only rank 0 has an optimizer. Returns the global batch's mean loss (on every rank).
static double train_step(Communicator& comm, Model& model, std::optional<Optimizer>& optimizer,
                         Buffer& scratch, const Dataset& train, const Sampler& sampler, int64_t t,
                         const TrainConfig& config, int64_t step) {
  const int64_t K = config.grad_accum_steps;
  const int N = comm.world_size();
  model.zero_grad();
  double loss_sum = 0;
  for (int64_t micro_step = 0; micro_step < K; ++micro_step) {
    Batch batch = make_batch(
        train, rank_micro_batch(sampler, t, comm.rank(), N, K, micro_step));  // (B/(N K), in)
    Tape tape;
    Var loss = forward_loss(tape, model, batch);  // mean over this micro-batch
    loss_sum += loss->value[0];
    tape.backward(loss, 1.0f / K);  // grads += dloss/K: the mean over this rank's share
  }
  const double loss_value = global_mean(comm, loss_sum / K);  // equal shares: mean of means
  check_finite_loss(comm, loss_sum / K, loss_value, step);  // all stop together; names the rank(s)

  std::span<float> grads = model.grads_memory.span(), params = model.params_memory.span();
  reduce_to_rank0(comm, grads, scratch.span());  // rank 0: Σ over ranks of the share means
  if (comm.rank() == 0) {
    for (float& g : grads) g /= N;  // mean of N equal shares = global-batch mean
    if (config.clip_grad_norm > 0) clip_grad_norm(grads, config.clip_grad_norm);
    optimizer->step(params, grads);
  }
  broadcast_from_rank0(comm, params);  // everyone continues from rank 0's weights
  return loss_value;
}

int main(int argc, char** argv) {
  Communicator comm(argc, argv);  // outlives run_main, so a failure can still MPI_Abort every rank
  CLI::App app{"RingZero chapter 03: data parallel with a central reducer (rank 0), under mpirun"};
  TrainConfig config;
  add_train_flags(app, config, /*with_grad_accum=*/true);
  if (int rc = parse_flags_on_every_rank(comm, app, argc, argv); rc >= 0) return rc;

  return run_main([&] {
    verify_same_flags(comm, app,
                      {seed_checked_elsewhere(config), "init-from",
                       "data-dir"});  // those two: the parameter check
    const int N = comm.world_size();
    validate(config, N);
    if (comm.rank() == 0) {                                  // the rank that writes them
      check_output_path("--save-final", config.save_final);  // before training, not after it
      check_output_path("--metrics", config.metrics);
    }
    TrainTestData data = load_data(config);
    std::unique_ptr<Model> model = build_model(config);
    broadcast_and_verify_parameters(comm, *model);  // same start on every rank, or stop here
    verify_same_data(comm, data);        // same samples and content on every rank, or stop here
    std::optional<Optimizer> optimizer;  // rank 0 only: the others never step
    if (comm.rank() == 0) optimizer.emplace(config, parameter_sizes(*model));
    Buffer scratch(comm.rank() == 0 ? model->num_parameters() : 0,
                   MemTag::comm_buffers);  // (Ψ) one incoming gradient
    Sampler sampler(data.train.size, config.global_batch_size, config.seed, !config.no_shuffle);
    StepLogger logger(config.metrics, comm.rank(), config.log_every);
    const int64_t steps = total_steps(config, sampler.steps_per_epoch());
    print0("ch03_data_parallel | model " + config.model + " | " +
           std::to_string(model->num_parameters()) + " parameters | global batch " +
           std::to_string(config.global_batch_size) + " = " + std::to_string(N) + " ranks x " +
           std::to_string(config.grad_accum_steps) + " x " +
           std::to_string(config.micro_batch_size(N)) + " | " + std::to_string(steps) + " steps");
    const nlohmann::json startup = finish_setup(comm);

    StepTimes times;
    double loss = 0, test_loss = 0, test_accuracy = -1;
    int64_t step = 0;
    for (int64_t epoch = 1; epoch <= config.epochs && step < steps; ++epoch) {
      sampler.set_epoch(epoch - 1);
      for (int64_t t = 0; t < sampler.steps_per_epoch() && step < steps; ++t) {
        Stopwatch watch;
        loss = train_step(comm, *model, optimizer, scratch, data.train, sampler, t, config, ++step);
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
    const StateBytes states = fp32_state_bytes(config.optimizer, config.momentum);
    const std::string ledger_formula =
        "formula (" + std::string(states.name) + " on rank 0 only): rank 0 " +
        full_copy_formula_text(states) + " = " + human_bytes(states.per_param() * psi) +
        ", other ranks 4Ψ + 4Ψ = 8Ψ = " + human_bytes(8.0 * psi) +
        "; rank 0's comm_buffers: one gradient, 4Ψ";
    nlohmann::json summary =
        end_of_run_report(comm, step, startup, ledger_formula, central_reducer_traffic(N, psi));
    if (comm.rank() == 0) {
      summary.update({{"chapter", "03_data_parallel"},
                      {"world_size", N},
                      {"steps", step},
                      {"final_loss", loss},
                      {"test_loss", test_loss},
                      {"test_accuracy", test_accuracy},
                      {"ms_per_step", times.median_ms()},
                      {"num_parameters", psi}});
      logger.summary(summary);
    }
    return 0;
  });
}
