#include "common/driver/run.hpp"

#include <algorithm>

#include "common/checks/collective_check.hpp"
#include "common/checks/data_check.hpp"
#include "common/checks/finite_check.hpp"
#include "common/core/check.hpp"
#include "common/core/ledger.hpp"
#include "common/device/device_ext.hpp"
#include "common/driver/dist_config.hpp"
#include "common/driver/dist_eval.hpp"
#include "common/io/atomic_file.hpp"
#include "common/io/checkpoint.hpp"
#include "common/io/safetensors.hpp"
#include "common/report/attribution.hpp"
#include "common/report/cost_model.hpp"
#include "common/report/dist.hpp"
#include "common/report/part_model.hpp"

namespace ringzero {

namespace {

// --precision / --reduce-dtype (registered with the shared flags, config.cpp): the pairs every
// chapter trains with (with_precision.hpp builds the engine for them), checked once, before any
// chapter is built, naming the flag and the fix.
class PrecisionCheck : public Extension {
 public:
  void validate(const RunState& s) override {
    const TrainConfig& c = s.config;
    // One process sums no gradients across ranks: only the --precision's own dtype is a no-op.
    RZ_CHECK(c.reduce_dtype.empty() || s.chapter.distributed || c.reduce_dtype == c.precision,
             "--reduce-dtype " << c.reduce_dtype << ": chapter " << s.chapter.name
                               << " runs on one process and reduces no gradients across ranks; "
                                  "drop --reduce-dtype");
    // Gradients are summed in the parameters' dtype or in fp32 (16-bit sums of fp32
    // parameters, or fp16 sums of bf16 ones, are not offered).
    RZ_CHECK(c.reduce_dtype.empty() || c.reduce_dtype == "fp32" || c.reduce_dtype == c.precision,
             "--reduce-dtype " << c.reduce_dtype << " with --precision " << c.precision
                               << ": gradients are summed in the parameters' dtype or in fp32; "
                               << (c.precision == "fp32"
                                       ? "drop --reduce-dtype, or add --precision " + c.reduce_dtype
                                       : "use --reduce-dtype " + c.precision + " or fp32"));
  }
};

}  // namespace

std::vector<std::unique_ptr<Extension>> extensions() {
  std::vector<std::unique_ptr<Extension>> list;
  list.push_back(std::make_unique<PrecisionCheck>());
  // A feature every chapter gets: list.push_back(std::make_unique<MyFeature>());
  list.push_back(cost_model_extension());  // --net-*: the predicted step (cost_model.hpp)
  list.push_back(std::make_unique<DeviceExtension>());  // --device cpu|emulated|cuda
  list.push_back(checkpoint_extension());               // --checkpoint-*, --resume (checkpoint.hpp)
  list.push_back(collective_check_extension());  // --check-collectives (collective_check.hpp)
  list.push_back(gradient_scan_extension());     // where a gradient first turns non-finite
  list.push_back(attribution_extension());       // --attribute, --delay-rank (attribution.hpp)
  list.push_back(part_comparison_extension());   // the account predicted beside (part_model.hpp)
  return list;
}

Run::Run(int argc, char** argv, Chapter chapter)
    : argc_(argc), argv_(argv), chapter_(std::move(chapter)), extensions_(extensions()) {
  if (chapter_.distributed) comm_ = std::make_unique<Communicator>(argc_, argv_);
  cli_.app.description("RingZero chapter " + chapter_.name.substr(0, chapter_.name.find('_')) +
                       ": " + chapter_.title);  // the folder's number
  add_train_flags(cli_.app, config_, chapter_.grad_accum);
  in_help_group(cli_.app, "Tracing and state", [&] {
    // Chapters 01-04 take --trace only to refuse it (check_output_paths), with its reason.
    CLI::Option* trace = cli_.app.add_option(
        "--trace", trace_path_,
        chapter_.trace ? "write a Chrome trace (ui.perfetto.dev) of the first --trace-steps steps"
                       : "chapters 05-08 only (this one has no communication thread to trace)");
    if (chapter_.trace)
      cli_.app.add_option("--trace-steps", trace_steps_, "optimizer steps to trace")
          ->check(CLI::Range(1, 1000000))
          ->needs(trace->check(non_empty_path("a .json file")));
    if (chapter_.optimizer_state)
      cli_.app
          .add_option("--save-optimizer-state", optimizer_state_path_,
                      "write AdamW's state, gathered, to a safetensors file")
          ->check(non_empty_path("a safetensors file"));
  });
  // The extensions' flags (device, checks, cost model, attribution): each in its own group.
  in_help_group(cli_.app, "Device and checks", [&] {
    for (auto& e : extensions_) e->add_flags(cli_);
  });
}

Run::~Run() = default;

Communicator& Run::comm() {
  RZ_CHECK(comm_, "chapter " << chapter_.name << " runs on one process: it has no communicator");
  return *comm_;
}

int Run::train_impl(LessonOptions& options,
                    const std::function<std::unique_ptr<Lesson>(SetUp&)>& make_lesson,
                    const std::function<double(Lesson&, const Step&)>& train_step) {
  options.add_flags(cli_);
  const int rc = comm_ ? parse_flags_on_every_rank(*comm_, cli_.app, argc_, argv_)
                       : parse_flags(cli_.app, argc_, argv_);
  if (rc >= 0) return rc;
  return run_main([&] { return run(options, make_lesson, train_step); });
}

std::string Run::start_line(const Lesson& lesson, int64_t psi, int64_t steps) const {
  const int N = comm_ ? comm_->world_size() : 1;
  std::string batch = std::to_string(config_.global_batch_size);
  if (chapter_.distributed)
    batch += " = " + std::to_string(N) + " ranks x " + std::to_string(config_.grad_accum_steps) +
             " x " + std::to_string(config_.micro_batch_size(N));
  else if (chapter_.grad_accum)
    batch += " = " + std::to_string(config_.grad_accum_steps) + " x " +
             std::to_string(config_.micro_batch_size(1));
  return "ch" + chapter_.name + " | model " + config_.model + " | " + std::to_string(psi) +
         " parameters | global batch " + batch + " | " + std::to_string(steps) + " steps" +
         lesson.banner();
}

// What the loop's steps and evaluations work on: set-up's objects (run() owns them), the loop's
// sizes and its step times.
struct Run::Loop {
  RunState& state;
  const std::function<double(Lesson&, const Step&)>& train_step;
  TrainTestData& data;
  Model& model;
  Lesson& lesson;
  Sampler& sampler;
  Tracer& tracer;
  StepLogger& logger;
  const int N, rank;
  const int64_t steps, K;
  const int64_t first_step;  // the step this run starts after (a resumed run's checkpoint)
  StepTimes times{};
};

int Run::run(LessonOptions& options,
             const std::function<std::unique_ptr<Lesson>(SetUp&)>& make_lesson,
             const std::function<double(Lesson&, const Step&)>& train_step) {
  // One process: N copies under mpirun would each train alone and clash on the output files.
  if (!comm_) refuse_multi_process_launch("ch" + chapter_.name);
  if (comm_) verify_flags_across_ranks();
  if (options.run_instead(comm_.get())) return 0;
  const int N = comm_ ? comm_->world_size() : 1, rank = comm_ ? comm_->rank() : 0;
  validate(config_, N);
  RunState state{chapter_, config_, comm_.get(), rank, N};
  for (auto& e : extensions_) e->validate(state);
  check_output_paths(rank);

  // Set-up: data, the model (the same on every rank, or stop here), the lesson object.
  TrainTestData data = load_data(config_);
  std::unique_ptr<Model> model = build_model(config_);
  if (comm_) verify_same_start(*model, data);
  const int64_t psi = model->num_parameters();
  state.model = model.get();
  for (auto& e : extensions_) e->before_lesson(state);
  Tracer tracer;
  SetUp setup{comm_.get(), *model, config_, tracer};
  std::unique_ptr<Lesson> lesson = make_lesson(setup);
  start_lesson(*lesson, tracer);
  Sampler sampler(data.train.size, config_.global_batch_size, config_.seed, !config_.no_shuffle);
  StepLogger logger(config_.metrics, rank, config_.log_every, !config_.resume.empty());
  const int64_t steps = total_steps(config_, sampler.steps_per_epoch());
  const nlohmann::json startup = announce_start(*lesson, psi, steps);
  state.data = &data;
  state.model = model.get();
  state.lesson = lesson.get();
  state.sampler = &sampler;
  state.tracer = &tracer;
  state.logger = &logger;
  state.steps = steps;
  for (auto& e : extensions_) e->after_setup(state);  // a resumed run's state.step
  note_trace_steps(steps - state.step);

  // The loop: one train_step per global batch, the step line, evaluation after each epoch.
  const int64_t K = config_.grad_accum_steps, per_epoch = sampler.steps_per_epoch();
  Loop loop{state,  train_step, data, *model, *lesson, sampler,   tracer,
            logger, N,          rank, steps,  K,       state.step};
  // A run resumed at the end of an epoch (or at its last step) starts in that epoch, with no
  // step left in it: the run it continues may have stopped between that step's checkpoint and
  // the epoch's evaluation, which is then done here (StepLogger::continue_after drops a
  // recorded one, so --metrics holds it once).
  const int64_t first_epoch = 1 + std::max<int64_t>(state.step - 1, 0) / per_epoch;
  for (int64_t epoch = first_epoch;
       epoch <= config_.epochs && (state.step < steps || (epoch == first_epoch && state.step > 0));
       ++epoch) {
    sampler.set_epoch(epoch - 1);
    for (int64_t t = state.step - (epoch - 1) * per_epoch; t < per_epoch && state.step < steps; ++t)
      train_one_step(loop, epoch, t);  // the step line, then after_step (checkpoints)
    if (config_.eval_every_epoch) evaluate_epoch(loop, epoch);
  }
  report(state, startup, loop.times.median_ms());
  return 0;
}

void Run::verify_flags_across_ranks() {
  // With --init-from the weights no longer show --seed (it still drives the shuffle): then
  // --seed is compared as a flag (seed_checked_elsewhere, data_check.hpp).
  std::vector<std::string> skip = cli_.checked_elsewhere;
  // Decided together: a rank with --init-from and one without would otherwise compare
  // different lists of flags (and blame an unrelated flag).
  std::vector<double> init_from_given = {config_.init_from.empty() ? 0.0 : 1.0};
  comm_->all_reduce_metrics(init_from_given);
  TrainConfig probe;
  if (init_from_given[0] > 0) probe.init_from = "(given on some rank)";
  std::replace(skip.begin(), skip.end(), std::string("seed"),
               std::string(seed_checked_elsewhere(probe)));
  verify_same_flags(*comm_, cli_.app, skip);
}

void Run::check_output_paths(int rank) {
  // Rank 0 writes these: checked before training, not after it, and every rank stops if one
  // fails (each rank's --checkpoint-dir is checked the same way, checkpoint_guard.cpp).
  check_on_every_rank(comm_.get(), [&] {
    RZ_CHECK(chapter_.trace || cli_.app.count("--trace") == 0,
             "--trace: this chapter has no communication thread to trace; --trace is chapters "
             "05-08's (e.g. mpirun -np 2 build/bin/ch05_ddp_buckets --trace ddp.json)");
    if (rank == 0)
      check_outputs({{"--save-final", config_.save_final, "final.safetensors"},
                     {"--metrics", config_.metrics, "metrics.jsonl"},
                     {"--trace", trace_path_, "trace.json"},
                     {"--save-optimizer-state", optimizer_state_path_, "optimizer.safetensors"}},
                    config_.checkpoint_dir, {{"--init-from", config_.init_from}});
  });
}

void Run::verify_same_start(Model& model, const TrainTestData& data) {
  broadcast_and_verify_parameters(*comm_, model);  // same start on every rank, or stop here
  verify_same_data(*comm_, data);  // same samples and content on every rank, or stop here
}

void Run::start_lesson(Lesson& lesson, Tracer& tracer) {
  if (lesson.reset_ledger_peaks()) Ledger::get().reset_peaks();
  if (std::string text = lesson.explanation(); !text.empty()) print0(text);
  if (!trace_path_.empty()) {
    lesson.start_trace(tracer);
    sync_epoch(*comm_, tracer);
  }
}

nlohmann::json Run::announce_start(const Lesson& lesson, int64_t psi, int64_t steps) {
  print0(start_line(lesson, psi, steps));
  return comm_ ? finish_setup(*comm_) : nlohmann::json();
}

void Run::note_trace_steps(int64_t steps_left) {
  if (!trace_path_.empty() && trace_steps_ > steps_left)
    print0("note: --trace-steps " + std::to_string(trace_steps_) + " is more than the " +
           std::to_string(steps_left) + " steps this run trains: the trace holds " +
           (steps_left > 0 ? "all " + std::to_string(steps_left) : std::string("none")));
}

void Run::train_one_step(Loop& loop, int64_t epoch, int64_t t) {
  RunState& state = loop.state;
  Tracer& tracer = loop.tracer;
  StepClock& clock = StepClock::this_thread();  // time per part, only with --attribute
  Stopwatch watch;
  clock.start();
  for (auto& e : extensions_) e->before_step(state);
  // --trace-steps: the first steps of this run (after a resumed run's checkpoint)
  tracer.set_enabled(!trace_path_.empty() && state.step - loop.first_step < trace_steps_);
  Step step{loop.model, loop.K, ++state.step, [&, t](int64_t micro_step) {
              return make_batch(loop.data.train, rank_micro_batch(loop.sampler, t, loop.rank,
                                                                  loop.N, loop.K, micro_step));
            }};
  {  // the lesson's step, one span on the trace (--trace), named only then
    std::optional<Tracer::Span> span;
    if (tracer.enabled()) span.emplace(tracer, "step " + std::to_string(step.step), "step");
    state.loss = loop.train_step(loop.lesson, step);
  }
  tracer.set_enabled(false);
  state.last_parts = clock.stop();
  loop.times.add(watch.ms());
  state.last_ms = watch.ms();
  loop.logger.step(state.step, loop.steps, epoch, state.loss,
                   config_.global_batch_size / (watch.ms() / 1e3), watch.ms());
  for (auto& e : extensions_) e->after_step(state);
}

void Run::evaluate_epoch(Loop& loop, int64_t epoch) {
  std::optional<EvalResult> e = loop.lesson.evaluate(loop.data.test);
  if (!e) {
    if (comm_) {
      e = evaluate_distributed(*comm_, loop.model, loop.data.test);
    } else {
      EvalSums sums = evaluate(loop.model, loop.data.test, 0, loop.data.test.size);
      e = EvalResult{sums.loss_sum / sums.count,
                     config_.classification() ? sums.correct / sums.count : -1};
    }
  }
  loop.state.test_loss = e->test_loss;
  loop.state.test_accuracy = e->test_accuracy;
  loop.logger.eval(epoch, loop.state.test_loss, loop.state.test_accuracy);
}

}  // namespace ringzero
