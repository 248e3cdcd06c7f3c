// run: the training driver every chapter shares, so that main.cpp states only the chapter's
// idea: which lesson object it builds and which train_step it runs.
//
// Provides: Chapter (name, title, which shared flags apply), RunState (what the driver and its
// extensions see during a run), Extension (a feature every chapter gets without a line in any
// main.cpp: register it in run.cpp's extensions()), and Run, which owns the command line and
// its cross-rank check, data, model, the epoch loop and its logging, evaluation, the trace and
// the end-of-run report (memory ledger, traffic, summary record, saved files).
// Leaves out: the training step and the lesson object (lesson.hpp), config files.
//
// A run, in order (the extension points in brackets):
//   flags: shared flags, the lesson's options.add_flags, [Extension::add_flags]; parse on
//     every rank; check every rank has the same flags; options.run_instead (the memory
//     calculator, the all-reduce benchmark); validate(config) [Extension::validate]
//   set-up: data, model, broadcast_and_verify_parameters, the lesson object, start-up line,
//     --explain, trace tracks [Extension::after_setup: e.g. load a checkpoint, move state
//     to step > 0]
//   loop: per optimizer step [Extension::before_step] train_step, the step line (StepLogger,
//     metrics.hpp) [Extension::after_step]; evaluation after each epoch
//   report: trace file, ledger and traffic tables [Extension::report adds lines and summary
//     fields], summary record, --save-final, --save-optimizer-state
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "common/comm/comm.hpp"
#include "common/core/nn.hpp"
#include "common/core/step_time.hpp"
#include "common/data/data.hpp"
#include "common/driver/config.hpp"
#include "common/driver/lesson.hpp"
#include "common/driver/train.hpp"
#include "common/precision/with_precision.hpp"
#include "common/report/metrics.hpp"
#include "common/report/trace.hpp"

namespace ringzero {

/// What a chapter is, for --help, the start-up line and the summary record.
struct Chapter {
  std::string name;              ///< its folder, "05_ddp_buckets"; the binary is ch<name>
  std::string title;             ///< --help's first line
  bool distributed = true;       ///< under mpirun: ranks, flag cross-check, distributed evaluation
  bool grad_accum = true;        ///< has --grad-accum-steps (chapter 01 does not)
  bool optimizer_state = false;  ///< has --save-optimizer-state (the lesson exposes the state)
  bool trace = false;            ///< has --trace/--trace-steps (its train_step records spans)
};

/// What the driver knows during a run; extensions read and (at after_setup) move it.
struct RunState {
  const Chapter& chapter;
  TrainConfig& config;
  Communicator* comm = nullptr;  ///< null on one process
  int rank = 0, world_size = 1;
  TrainTestData* data = nullptr;
  Model* model = nullptr;
  Lesson* lesson = nullptr;
  Sampler* sampler = nullptr;
  Tracer* tracer = nullptr;
  StepLogger* logger = nullptr;
  int64_t steps = 0;  ///< optimizer steps of the whole run
  /// Optimizer steps done. The loop starts at global batch step % steps_per_epoch of epoch
  /// 1 + step / steps_per_epoch: an extension that restores a run at after_setup sets it.
  int64_t step = 0;
  /// The step a resumed run started from (0: a fresh run). This process's counters (traffic)
  /// cover steps resumed_step + 1 .. step only.
  int64_t resumed_step = 0;
  double loss = 0;                           ///< the last step's global-batch mean loss
  double test_loss = 0, test_accuracy = -1;  ///< the last evaluation
  double last_ms = 0;                        ///< the last step's wall time
  StepParts last_parts{};  ///< the last step's time per part on this rank (step_time.hpp)
};

/// A feature every chapter has, with no line in any main.cpp (checkpoints, precision, devices,
/// a network cost model). Every hook runs on every rank; a collective in one runs on all.
class Extension {
 public:
  virtual ~Extension() = default;
  /// Registers the feature's flags (before parsing).
  virtual void add_flags(CommandLine&) {}
  /// After parsing and the cross-rank check, before set-up: RZ_CHECK the flags' values.
  virtual void validate(const RunState&) {}
  /// After the model is built and checked, before the lesson object exists (state.model is
  /// set): what hooks the model here runs before the lesson's own hooks (DDP's, ZeRO's).
  virtual void before_lesson(RunState&) {}
  /// After set-up (model, lesson object, start-up line), before the first step.
  virtual void after_setup(RunState&) {}
  /// Before each optimizer step, inside its timing (state.step is the step before it): a
  /// fault injected here (--delay-rank) is part of the step it slows.
  virtual void before_step(RunState&) {}
  /// After each optimizer step (state.step is that step's number, state.loss its loss).
  virtual void after_step(RunState&) {}
  /// End of run, after the ledger and traffic tables: print lines, add summary fields (rank 0's
  /// `summary` is the one written).
  virtual void report(RunState&, nlohmann::json& /*summary*/) {}
};

/// The extensions every run has, in hook order. Add a feature here (run.cpp).
std::vector<std::unique_ptr<Extension>> extensions();

/// Checkpoints: --checkpoint-dir, --checkpoint-every, --keep-checkpoints, --resume
/// (common/io/checkpoint.hpp; the flags are registered with the shared ones in config.cpp).
std::unique_ptr<Extension> checkpoint_extension();

/// A lesson's options: its flags and, optionally, a job that replaces training.
struct LessonOptions {
  virtual ~LessonOptions() = default;
  /// Registers the lesson's flags (bucket caps, collectives, --explain-*...).
  virtual void add_flags(CommandLine&) {}
  /// After the flags are checked, before set-up: returns true when it did the whole job (the
  /// memory calculator, the all-reduce benchmark) and the run ends there.
  virtual bool run_instead(Communicator*) { return false; }
};

/// The training driver. Construct it first in main (it starts MPI for distributed chapters),
/// then call train() once.
class Run {
 public:
  Run(int argc, char** argv, Chapter chapter);
  ~Run();

  /// Parses the flags, sets up, trains and reports (see the top of this file); returns main's
  /// exit code. The lesson object is built after the model as L(SetUp&, const Flags&) (or
  /// L(SetUp&) without flags); train_step(lesson, step) runs one optimizer step and returns the
  /// global-batch mean loss, equal on every rank.
  template <class L, class Flags>
  int train(Flags& flags, double (*train_step)(L&, const Step&)) {
    static_assert(std::is_base_of_v<Lesson, L> && std::is_base_of_v<LessonOptions, Flags>);
    return train_impl(
        flags, [&](SetUp& s) -> std::unique_ptr<Lesson> { return std::make_unique<L>(s, flags); },
        [train_step](Lesson& lesson, const Step& step) {
          return train_step(static_cast<L&>(lesson), step);
        });
  }
  /// For lessons without flags of their own (chapter 03).
  template <class L>
  int train(double (*train_step)(L&, const Step&)) {
    return train_without_flags<L>([train_step](L& lesson, const Step& step) {
      return train_step(lesson, step);
    });
  }
  /// For the one-process chapters 01-02, whose step needs only the lesson object's optimizer in
  /// its precision (L::precision, a ReplicatedPrecision): train_step(lesson.precision, step).
  template <class L>
  int train(double (*train_step)(Precision&, const Step&)) {
    return train_without_flags<L>([train_step](L& lesson, const Step& step) {
      return train_step(lesson.precision, step);
    });
  }

  /// For lessons written over the element types (chapters 06-08): builds L<T, R>, T and R
  /// from --precision and --reduce-dtype (common/precision/with_precision.hpp), as L<T, R>(SetUp&,
  /// const Flags&); train_step(L<T, R>&, step), a generic callable (a lambda that calls the
  /// chapter's train_step template), runs one optimizer step. Errors: a --precision/--reduce-dtype
  /// pair with_precision does not build (PrecisionCheck refuses it first, naming the fix).
  template <template <class, class> class L, class Flags, class TrainStep>
  int train(Flags& flags, TrainStep train_step) {
    static_assert(std::is_base_of_v<LessonOptions, Flags>);
    auto step = std::make_shared<std::function<double(Lesson&, const Step&)>>();
    return train_impl(
        flags,
        [&flags, step, train_step](SetUp& s) -> std::unique_ptr<Lesson> {
          return with_precision(s.config, [&]<class T, class R>() -> std::unique_ptr<Lesson> {
            *step = [train_step](Lesson& lesson, const Step& st) {
              return train_step(static_cast<L<T, R>&>(lesson), st);
            };
            return std::make_unique<L<T, R>>(s, flags);
          });
        },
        [step](Lesson& lesson, const Step& st) { return (*step)(lesson, st); });
  }

  /// Adds an extension for this run only, after extensions()' (a test binary's, for instance).
  /// Call before train().
  void add_extension(std::unique_ptr<Extension> extension) {
    extension->add_flags(cli_);
    extensions_.push_back(std::move(extension));
  }

  /// The communicator of a distributed chapter (RZ_CHECK otherwise).
  Communicator& comm();
  const TrainConfig& config() const { return config_; }

 private:
  /// L built as L(SetUp&); step(L&, const Step&) runs one optimizer step.
  template <class L, class StepOf>
  int train_without_flags(StepOf step) {
    static_assert(std::is_base_of_v<Lesson, L>);
    LessonOptions none;
    return train_impl(
        none, [](SetUp& s) -> std::unique_ptr<Lesson> { return std::make_unique<L>(s); },
        [step](Lesson& lesson, const Step& st) { return step(static_cast<L&>(lesson), st); });
  }
  int train_impl(LessonOptions& options,
                 const std::function<std::unique_ptr<Lesson>(SetUp&)>& make_lesson,
                 const std::function<double(Lesson&, const Step&)>& train_step);
  int run(LessonOptions& options, const std::function<std::unique_ptr<Lesson>(SetUp&)>& make_lesson,
          const std::function<double(Lesson&, const Step&)>& train_step);
  /// What the loop's steps and evaluations work on (run.cpp): set-up's objects, the loop's sizes
  /// and its step times.
  struct Loop;
  /// Distributed: every rank has the same flags (--seed too when --init-from is given on some
  /// rank), or every rank stops here.
  void verify_flags_across_ranks();
  /// Rank 0's output files (--save-final, --metrics, --trace, --save-optimizer-state) can be
  /// written; every rank stops if one cannot.
  void check_output_paths(int rank);
  /// Distributed: the same initial parameters and data on every rank, or stop here.
  void verify_same_start(Model& model, const TrainTestData& data);
  /// After the lesson object is built: ledger peaks, the --explain text, the trace's tracks.
  void start_lesson(Lesson& lesson, Tracer& tracer);
  /// Prints the start-up line; returns finish_setup()'s record.
  nlohmann::json announce_start(const Lesson& lesson, int64_t psi, int64_t steps);
  /// With --trace: a note when --trace-steps exceeds the `steps_left` this run trains.
  void note_trace_steps(int64_t steps_left);
  /// One optimizer step at position t of `epoch`: train_step, the step line, after_step hooks.
  void train_one_step(Loop& loop, int64_t epoch, int64_t t);
  /// The evaluation after `epoch`: the lesson's own, or the driver's; the eval line.
  void evaluate_epoch(Loop& loop, int64_t epoch);
  std::string start_line(const Lesson& lesson, int64_t psi, int64_t steps) const;
  void report(RunState& state, const nlohmann::json& startup, double median_ms);

  int argc_;
  char** argv_;
  Chapter chapter_;
  std::unique_ptr<Communicator> comm_;  ///< outlives run_main: a failure can MPI_Abort every rank
  CommandLine cli_;
  TrainConfig config_;
  std::string trace_path_, optimizer_state_path_;
  int64_t trace_steps_ = 5;
  std::vector<std::unique_ptr<Extension>> extensions_;
};

}  // namespace ringzero
