// config: the command line every chapter shares (listed in README.md, "Reading the code"), parsed
// with CLI11.
//
// Provides: TrainConfig, add_train_flags() to register the shared flags on a CLI::App, and
// validate(), which checks what CLI11 cannot (sizes that must divide) and derives the
// per-rank micro-batch size. Chapter-specific flags are added by the chapter itself.
// Leaves out: config files, environment variables.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/core/optim.hpp"
#include "common/data/data.hpp"

namespace ringzero {

struct TrainConfig {
  std::string data;  ///< fashion-mnist | synthetic; "" = the model's own
  std::string data_dir = kFashionMnistDir;
  std::string model = "mlp";          ///< mlp (784-512-512-10, CE) | toy (1024-1024-1024-256, MSE)
  std::vector<int64_t> hidden_sizes;  ///< overrides the model's hidden widths
  int64_t epochs = 1;
  int64_t max_steps = -1;           ///< stop after this many optimizer steps in total; -1: no limit
  int64_t global_batch_size = 64;   ///< B = world_size * micro_batch_size * grad_accum_steps
  int64_t grad_accum_steps = 1;     ///< K
  std::string optimizer = "adamw";  ///< adamw | sgd
  float lr = 1e-3f;
  float weight_decay = 1e-2f;
  float momentum = 0.0f;        ///< SGD only
  float clip_grad_norm = 0.0f;  ///< 0: no clipping
  uint64_t seed = 0;
  bool no_shuffle = false;
  int64_t log_every = 100;
  std::string metrics;                ///< JSONL path, "" for none
  std::string init_from, save_final;  ///< safetensors paths
  int64_t eval_every_epoch = 1;       ///< 0: skip evaluation (tests)
  std::string precision = "fp32";     ///< fp32 | bf16 | fp16 (common/precision/mixed.hpp)
  std::string reduce_dtype;           ///< fp32 | bf16 | fp16; "" = the precision's
  std::string checkpoint_dir;         ///< where checkpoints go (common/io/checkpoint.hpp)
  int64_t checkpoint_every = 0;       ///< optimizer steps between checkpoints; 0: none
  int64_t keep_checkpoints = 0;       ///< keep the newest K committed checkpoints; 0: all
  std::string resume;                 ///< a checkpoint directory, or a --checkpoint-dir

  /// Layer sizes {in, hidden..., out} for the chosen model.
  std::vector<int64_t> layer_sizes() const;
  bool classification() const { return model == "mlp"; }
  /// --data, or the model's own dataset when --data is not given.
  std::string dataset() const {
    return !data.empty() ? data : classification() ? "fashion-mnist" : "synthetic";
  }
  /// B / (world_size * K), after validate().
  int64_t micro_batch_size(int world_size) const {
    return global_batch_size / (world_size * grad_accum_steps);
  }
  /// The optimizer's flags, as Optimizer takes them (common/core/optim.hpp).
  operator OptimizerOptions() const { return {optimizer, lr, weight_decay, momentum}; }
};

/// Registers the shared flags, in --help groups of their own. with_grad_accum: whether this
/// chapter has --grad-accum-steps (chapter 01 does not).
void add_train_flags(CLI::App& app, TrainConfig& config, bool with_grad_accum);

/// A CLI11 check for a path flag: an empty or blank value (an unset shell variable, --metrics
/// "$OUT") is an error naming `give` (e.g. "a file"), not "not given" or a file named " ", so no
/// output is silently dropped.
CLI::Validator non_empty_path(const std::string& give);

/// Runs `add` and puts every option it added to `app` that has no group of its own into the
/// --help group `group`. A
/// chapter's own flags stay in the first group ("Options"), so --help lists them first and the
/// shared ones after, grouped.
void in_help_group(CLI::App& app, const std::string& group, const std::function<void()>& add);

/// Checks the values (every error names the flag, the value and the fix). Derived sizes
/// (world_size · K, the parameter count, the model-state bytes of --optimizer) are computed in
/// checked int64 and must fit this machine's memory (issue 9 item 3: no SIGFPE, no SIGSEGV).
/// world_size is the number of ranks; B must equal world_size * micro_batch_size * K for a whole
/// micro-batch.
void validate(const TrainConfig& config, int world_size);

/// Σ over layers of in·out + out for layer sizes {in, hidden..., out}, in checked int64.
/// Errors: the count leaves int64 (names `flag`, e.g. "--hidden-sizes").
int64_t num_parameters(const std::vector<int64_t>& sizes, const std::string& flag);

/// This machine's physical memory in bytes (sysconf), at most kMaxBytes (common/core/checked.hpp).
int64_t physical_memory_bytes();

/// min(epochs · steps_per_epoch, max_steps) (max_steps <= 0: no cap), without overflow when the
/// cap applies. Errors: the uncapped product leaves int64 (names --epochs).
int64_t total_steps_checked(int64_t epochs, int64_t steps_per_epoch, int64_t max_steps);

/// For the single-process chapters (01, 02): fails when a launcher (mpirun, srun) started this
/// binary as one of several processes, detected from the launcher's environment
/// (OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_SIZE... without initialising MPI). N copies would each
/// train alone and overwrite each other's files. The message names `program` and the chapter
/// to use instead (ch03_data_parallel or later), or, for a tool, `instead`: what each copy would
/// do and the fix.
void refuse_multi_process_launch(const std::string& program, const std::string& instead = "");

/// Parses argv; returns an exit code to return immediately (--help: 0, a bad flag: 2 after
/// printing CLI11's message naming it), or -1 to carry on.
int parse_flags(CLI::App& app, int argc, char** argv);

}  // namespace ringzero
