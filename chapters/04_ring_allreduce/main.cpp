// Chapter 04: ring all-reduce — every rank averages the gradients and steps its own optimizer.
//
//   mpirun -np 4 build/bin/ch04_ring_allreduce --epochs 5
//   mpirun -np 4 build/bin/ch04_ring_allreduce --collectives mpi    # MPI_Allreduce instead
//   mpirun -np 2 build/bin/ch04_ring_allreduce --bench-allreduce    # bus bandwidth, ours vs MPI
//
// Each rank trains on its 1/N of every global batch (K micro-steps each, as in chapter 02).
// After backward, each parameter's gradient is summed over ranks with a ring all-reduce
// (ring.hpp) and divided by N; every rank then takes the same optimizer step, so the weights
// stay identical without any broadcast. The numbers match chapter 03; the traffic printed at
// the end is the same on every rank, 2(N−1)/N·Ψ·4 bytes per step.
#include <cstdio>

#include "chapters/04_ring_allreduce/bench_allreduce.hpp"
#include "chapters/04_ring_allreduce/ring.hpp"
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

// Sum over ranks of each parameter's gradient, then / N: the gradient of the global-batch mean.
// One all-reduce per parameter, in registration order, as the seeds' DDP wrapper does.
static void all_reduce_gradients(Communicator& comm, Model& model, bool ring, Buffer& scratch) {
  for (size_t p = 0; p < model.parameters().size(); ++p) {
    std::span<float> grad =
        model.grads_memory.span().subspan(model.offsets()[p], model.parameters()[p]->numel());
    if (ring)
      ring_all_reduce(comm, grad, scratch.span());
    else
      comm.all_reduce(grad);  // MPI_Allreduce: the library's algorithm
    for (float& g : grad) g /= comm.world_size();
  }
}

// One optimizer step on global batch t: K micro-steps on this rank's share, the all-reduce, and
// the same optimizer step on every rank. Returns the global batch's mean loss (on every rank).
static double train_step(Communicator& comm, Model& model, Optimizer& optimizer, bool ring,
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

  all_reduce_gradients(comm, model, ring, scratch);  // identical grads on every rank, bit for bit
  if (config.clip_grad_norm > 0) clip_grad_norm(model.grads_memory.span(), config.clip_grad_norm);
  optimizer.step(model.params_memory.span(), model.grads_memory.span());  // same step everywhere
  return loss_value;
}

int main(int argc, char** argv) {
  Communicator comm(argc, argv);  // outlives run_main, so a failure can still MPI_Abort every rank
  CLI::App app{"RingZero chapter 04: data parallel with a ring all-reduce, under mpirun"};
  TrainConfig config;
  add_train_flags(app, config, /*with_grad_accum=*/true);
  std::string collectives = "ring";
  bool bench = false;
  app.add_option("--collectives", collectives, "ring (ours, ring.hpp) | mpi (MPI_Allreduce)")
      ->check(CLI::IsMember({"ring", "mpi"}));
  app.add_flag("--bench-allreduce", bench,
               "print a bus-bandwidth table, ours vs MPI_Allreduce, 4 KiB to 64 MiB");
  if (int rc = parse_flags_on_every_rank(comm, app, argc, argv); rc >= 0) return rc;

  return run_main([&] {
    verify_same_flags(comm, app,
                      {seed_checked_elsewhere(config), "init-from",
                       "data-dir"});  // those two: the parameter check
    const int N = comm.world_size();
    if (bench) return bench_allreduce(comm), 0;
    validate(config, N);
    if (comm.rank() == 0) {                                  // the rank that writes them
      check_output_path("--save-final", config.save_final);  // before training, not after it
      check_output_path("--metrics", config.metrics);
    }
    TrainTestData data = load_data(config);
    std::unique_ptr<Model> model = build_model(config);
    broadcast_and_verify_parameters(comm, *model);  // same start on every rank, or stop here
    verify_same_data(comm, data);  // same samples and content on every rank, or stop here
    Optimizer optimizer(config, parameter_sizes(*model));  // every rank: replicated optimizer state
    int64_t largest = 0;
    for (int64_t n : parameter_sizes(*model)) largest = std::max(largest, n);
    Buffer scratch(ring_chunk(largest, N, 0).size,
                   MemTag::comm_buffers);  // (ceil(Ψ_p / N)) one incoming chunk
    Sampler sampler(data.train.size, config.global_batch_size, config.seed, !config.no_shuffle);
    StepLogger logger(config.metrics, comm.rank(), config.log_every);
    const int64_t steps = total_steps(config, sampler.steps_per_epoch());
    print0("ch04_ring_allreduce | model " + config.model + " | " +
           std::to_string(model->num_parameters()) + " parameters | global batch " +
           std::to_string(config.global_batch_size) + " = " + std::to_string(N) + " ranks x " +
           std::to_string(config.grad_accum_steps) + " x " +
           std::to_string(config.micro_batch_size(N)) + " | " + std::to_string(steps) +
           " steps | collectives " + collectives);
    const nlohmann::json startup = finish_setup(comm);

    StepTimes times;
    double loss = 0, test_loss = 0, test_accuracy = -1;
    int64_t step = 0;
    for (int64_t epoch = 1; epoch <= config.epochs && step < steps; ++epoch) {
      sampler.set_epoch(epoch - 1);
      for (int64_t t = 0; t < sampler.steps_per_epoch() && step < steps; ++t) {
        Stopwatch watch;
        loss = train_step(comm, *model, optimizer, collectives == "ring", scratch, data.train,
                          sampler, t, config, ++step);
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
    TrafficTheory theory = ring_all_reduce_traffic(parameter_sizes(*model), N);
    if (collectives == "mpi")  // MPI does not report its wire traffic, only what we hand it
      theory = {std::vector<int64_t>(N, 4 * psi), std::vector<int64_t>(N, 4 * psi),
                "MPI_Allreduce: the counters show the Ψ·4 = " + human_bytes(4.0 * psi) +
                    " handed to MPI per step"};
    const StateBytes states = fp32_state_bytes(config.optimizer, config.momentum);
    const std::string ledger_formula = "formula (" + std::string(states.name) +
                                       ", every rank): " + full_copy_formula_text(states) + " = " +
                                       human_bytes(states.per_param() * psi) +
                                       "; comm_buffers: one chunk of the largest parameter";
    nlohmann::json summary = end_of_run_report(comm, step, startup, ledger_formula, theory);
    if (comm.rank() == 0) {
      summary.update({{"chapter", "04_ring_allreduce"},
                      {"world_size", N},
                      {"steps", step},
                      {"final_loss", loss},
                      {"test_loss", test_loss},
                      {"test_accuracy", test_accuracy},
                      {"ms_per_step", times.median_ms()},
                      {"num_parameters", psi},
                      {"collectives", collectives}});
      logger.summary(summary);
    }
    return 0;
  });
}
