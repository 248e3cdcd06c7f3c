// metrics: the per-step line, the JSONL metrics file, and the end-of-run report.
//
// Provides: StepLogger, which prints the line every chapter shares (so logs diff cleanly)
//   step 120/937 | epoch 1 | loss 0.4321 | 15234 samples/s | 4.2 ms/step
// and writes the --metrics FILE.jsonl lines ({"type":"step"|"eval"|"summary", ...}; flags in
// README.md, "Reading the code"; streamed whole line by whole line, so a crash or a full disk
// leaves a valid prefix: atomic_file.hpp's RecordFile says why it is not renamed into place);
// and the per-rank ledger table printed beside a formula. Only rank 0 prints and writes.
// Leaves out: TensorBoard, wandb, anything networked.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

namespace ringzero {

class RecordFile;  // atomic_file.hpp

class StepLogger {
 public:
  /// metrics_path "" writes no file. rank != 0 loggers are silent. resuming: the file is not
  /// truncated here; continue_after() keeps the interrupted run's records (a resumed run's
  /// curve continues the file, docs/checkpoints.md).
  /// Errors: the --metrics file cannot be created; later, a write that fails (disk full): the
  /// file then holds the whole records before it (RecordFile, atomic_file.hpp).
  StepLogger(const std::string& metrics_path, int rank, int64_t log_every, bool resuming = false);
  ~StepLogger();
  /// A --resume to step `step` (rank 0, before the first step): rewrites the metrics file
  /// (atomically) with its records up to that step: step records with step <= `step`, eval
  /// records of the epochs finished before it; later records (steps the interrupted run made
  /// after its checkpoint, and the evaluation at `step`, which the resumed run makes again)
  /// and summaries are dropped, so the file has each step and each evaluation once. Then
  /// appends. A missing file starts empty; a character device (/dev/null) is not read.
  /// `evaluates`: the resumed run evaluates each epoch (otherwise the evaluation at `step`,
  /// which it will not make again, is kept).
  void continue_after(int64_t step, int64_t steps_per_epoch, bool evaluates);
  /// Records one optimizer step. step is 1-based within the run, loss the global-batch mean.
  void step(int64_t step, int64_t total_steps, int64_t epoch, double loss, double samples_per_s,
            double ms_per_step);
  void eval(int64_t epoch, double test_loss, double test_accuracy);
  /// Writes {"type":"summary", ...fields} and prints nothing.
  void summary(nlohmann::json fields);
  void write(const nlohmann::json& record);

 private:
  int rank_;
  int64_t log_every_;
  std::unique_ptr<RecordFile> file_;  // rank 0 with --metrics: appended, whole lines only
  std::string path_;  ///< the --metrics file while resuming (opened by continue_after)
  std::string new_path_;  ///< the --metrics file of a fresh run, until its first record
};

/// This rank's ledger: {"<tag>": {"current": bytes, "peak": bytes}, "model_states_peak": ...}.
nlohmann::json ledger_json();

/// A table of the ledger of every rank (per_rank[r] = ledger_json() of rank r), with
/// `formula_line` (e.g. "formula (DDP, fp32 + Adam): 16Ψ = 10.7 MB") printed under it.
std::string format_ledger(const std::vector<nlohmann::json>& per_rank,
                          const std::string& formula_line);

/// "10.7 MB" style, decimal units as the ZeRO paper's tables.
std::string human_bytes(double bytes);

/// Wall-clock stopwatch in milliseconds.
class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  double ms() const {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_)
        .count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

/// Step times of a run. median_ms() skips the first step (allocation and cache warm-up).
class StepTimes {
 public:
  void add(double ms) { ms_.push_back(ms); }
  double median_ms() const;

 private:
  std::vector<double> ms_;
};

}  // namespace ringzero
