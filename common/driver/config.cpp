#include "common/driver/config.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "common/core/check.hpp"
#include "common/core/checked.hpp"
#include "common/zero/zero_memory.hpp"

namespace ringzero {

std::vector<int64_t> TrainConfig::layer_sizes() const {
  std::vector<int64_t> sizes;
  if (model == "mlp")
    sizes = {784, 512, 512, 10};
  else
    sizes = {1024, 1024, 1024, 256};
  if (!hidden_sizes.empty()) {
    std::vector<int64_t> s{sizes.front()};
    s.insert(s.end(), hidden_sizes.begin(), hidden_sizes.end());
    s.push_back(sizes.back());
    sizes = s;
  }
  return sizes;
}

namespace {

// The data and the model, and how long and in what batches to train on them.
void add_data_flags(CLI::App& app, TrainConfig& c, bool with_grad_accum) {
  app.add_option(
         "--data", c.data,
         "fashion-mnist | synthetic (the 1000-sample standard-normal 1024 -> 256 regression set)")
      ->check(CLI::IsMember({"fashion-mnist", "synthetic"}));
  app.add_option("--data-dir", c.data_dir, "directory with the four Fashion-MNIST .gz files");
  app.add_option("--model", c.model,
                 "mlp (784-512-512-10, cross-entropy) | toy (1024-1024-1024-256, MSE)")
      ->check(CLI::IsMember({"mlp", "toy"}));
  app.add_option("--hidden-sizes", c.hidden_sizes,
                 "hidden layer widths, e.g. 512,512 (default: the model's)")
      ->delimiter(',');
  app.add_option("--epochs", c.epochs, "passes over the training set");
  app.add_option("--max-steps", c.max_steps, "stop after this many optimizer steps (-1: no limit)");
  app.add_option("--global-batch-size", c.global_batch_size,
                 "samples per optimizer step, over all ranks");
  if (with_grad_accum)
    app.add_option("--grad-accum-steps", c.grad_accum_steps, "micro-steps per optimizer step (K)");
}

// The optimizer and its hyperparameters.
void add_optimizer_flags(CLI::App& app, TrainConfig& c) {
  app.add_option("--optimizer", c.optimizer, "adamw | sgd")->check(CLI::IsMember({"adamw", "sgd"}));
  app.add_option("--lr", c.lr, "learning rate");
  app.add_option("--weight-decay", c.weight_decay, "decoupled (AdamW) or L2 (SGD) weight decay");
  app.add_option("--momentum", c.momentum, "SGD momentum");
  app.add_option("--clip-grad-norm", c.clip_grad_norm,
                 "clip the global gradient L2 norm to this (0: off)");
}

// The seed and shuffle, the step and metrics lines, the files a run reads and writes, the
// evaluation.
void add_run_flags(CLI::App& app, TrainConfig& c) {
  // Checked as text: a double range would pass 12abc's parse error off as "not in range" and
  // let values past 2^64 - 1 through to a conversion that saturates.
  const CLI::Validator seed_range(
      [](std::string& v) -> std::string {
        const std::string max = "18446744073709551615";  // 2^64 - 1
        if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos)
          return "'" + v + "' is not an integer; give an integer in [0, " + max + "]";
        const std::string digits = v.substr(std::min(v.find_first_not_of('0'), v.size() - 1));
        if (digits.size() > max.size() || (digits.size() == max.size() && digits > max))
          return v + " is past 2^64 - 1 = " + max + "; give an integer in [0, " + max + "]";
        return "";
      },
      "an integer in [0, 2^64)");
  app.add_option("--seed", c.seed, "seed for initial weights, synthetic data and shuffling")
      ->check(seed_range);
  app.add_flag("--no-shuffle", c.no_shuffle, "step t uses samples [t B, (t+1) B) in file order");
  app.add_option("--log-every", c.log_every, "print the step line every N optimizer steps");
  app.add_option("--metrics", c.metrics, "write JSON lines (step, eval, summary) to this file")
      ->check(non_empty_path("a file"));
  app.add_option("--init-from", c.init_from, "initial parameters from a safetensors file")
      ->check(non_empty_path("a safetensors file"));
  app.add_option("--save-final", c.save_final, "write final parameters to a safetensors file")
      ->check(non_empty_path("a safetensors file"));
  app.add_option("--eval-every-epoch", c.eval_every_epoch,
                 "1: evaluate on the test set after each epoch, 0: never");
}

// The parameters' and the gradient sums' dtypes (docs/mixed-precision.md).
void add_precision_flags(CLI::App& app, TrainConfig& c) {
  app.add_option("--precision", c.precision,
                 "fp32 | bf16 | fp16: 16-bit parameters and gradients with fp32 master weights "
                 "(docs/mixed-precision.md)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  app.add_option("--reduce-dtype", c.reduce_dtype,
                 "fp32 | bf16 | fp16: the dtype gradients are summed in across ranks "
                 "(default: the --precision's)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
}

// Checkpoints and --resume (common/io/checkpoint.hpp).
void add_checkpoint_flags(CLI::App& app, TrainConfig& c) {
  const CLI::Validator non_empty = non_empty_path("a directory");
  app.add_option("--checkpoint-dir", c.checkpoint_dir,
                 "write checkpoints to D/step_SSSSSSSS (docs/checkpoints.md); with no "
                 "--checkpoint-every, only at the end of the run")
      ->check(non_empty);
  app.add_option("--checkpoint-every", c.checkpoint_every,
                 "save a checkpoint every S optimizer steps (0: only at the end)");
  app.add_option("--keep-checkpoints", c.keep_checkpoints,
                 "keep the newest K committed checkpoints (0: keep all)");
  app.add_option("--resume", c.resume,
                 "continue from a checkpoint: a step_* directory, or the newest committed one "
                 "in a --checkpoint-dir")
      ->check(non_empty);
}

}  // namespace

CLI::Validator non_empty_path(const std::string& give) {
  return CLI::Validator(
      [give](std::string& v) {
        return v.find_first_not_of(" \t") == std::string::npos  // "" or only blanks
                   ? "an empty path; give " + give + ", or leave the flag out"
                   : std::string();
      },
      "PATH");
}

void in_help_group(CLI::App& app, const std::string& group, const std::function<void()>& add) {
  const size_t before = app.get_options().size();
  add();
  const std::vector<CLI::Option*> options = app.get_options();
  for (size_t i = before; i < options.size(); ++i)
    if (options[i]->get_group() == "Options") options[i]->group(group);  // not one of its own
}

void add_train_flags(CLI::App& app, TrainConfig& c, bool with_grad_accum) {
  app.option_defaults()
      ->always_capture_default();  // --help shows every default, ours and the chapter's
  in_help_group(app, "Data, model and schedule", [&] { add_data_flags(app, c, with_grad_accum); });
  in_help_group(app, "Optimizer", [&] { add_optimizer_flags(app, c); });
  in_help_group(app, "Run and output", [&] { add_run_flags(app, c); });
  in_help_group(app, "Precision (docs/mixed-precision.md)", [&] { add_precision_flags(app, c); });
  in_help_group(app, "Checkpoints (docs/checkpoints.md)", [&] { add_checkpoint_flags(app, c); });
}

void validate(const TrainConfig& c, int world_size) {
  RZ_CHECK(
      c.classification() == (c.dataset() == "fashion-mnist"),
      "--model "
          << c.model << " does not fit --data " << c.dataset()
          << "; use --model mlp with --data fashion-mnist, or --model toy with --data synthetic");
  RZ_CHECK(c.epochs > 0, "--epochs " << c.epochs << " must be positive");
  RZ_CHECK(c.precision == "fp32" || c.optimizer == "adamw",
           "--precision " << c.precision << " keeps fp32 master weights for AdamW only; use "
                          << "--optimizer adamw or --precision fp32");
  RZ_CHECK(c.max_steps == -1 || c.max_steps > 0,
           "--max-steps " << c.max_steps << " must be positive (or -1: no limit)");
  RZ_CHECK(c.global_batch_size > 0,
           "--global-batch-size " << c.global_batch_size << " must be positive");
  RZ_CHECK(c.grad_accum_steps > 0,
           "--grad-accum-steps " << c.grad_accum_steps << " must be positive");
  RZ_CHECK(c.log_every > 0, "--log-every " << c.log_every << " must be positive");
  RZ_CHECK(std::isfinite(c.lr) && c.lr > 0, "--lr " << c.lr << " must be a positive finite number");
  RZ_CHECK(std::isfinite(c.weight_decay) && c.weight_decay >= 0,
           "--weight-decay " << c.weight_decay << " must be finite and >= 0");
  RZ_CHECK(std::isfinite(c.momentum) && c.momentum >= 0,
           "--momentum " << c.momentum << " must be finite and >= 0");
  RZ_CHECK(
      std::isfinite(c.clip_grad_norm) && c.clip_grad_norm >= 0,
      "--clip-grad-norm " << c.clip_grad_norm << " must be finite and >= 0 (0 turns clipping off)");
  RZ_CHECK(c.eval_every_epoch == 0 || c.eval_every_epoch == 1,
           "--eval-every-epoch " << c.eval_every_epoch << " must be 1 (evaluate) or 0 (never)");
  for (int64_t h : c.hidden_sizes)
    RZ_CHECK(h > 0, "--hidden-sizes has " << h << "; every width must be positive");
  // Derived sizes in checked int64 (common/core/checked.hpp): a product that wraps would divide by
  // zero or allocate a negative size later, far from the flag that caused it.
  const int64_t psi = num_parameters(c.layer_sizes(), "--hidden-sizes");
  const StateBytes b = fp32_state_bytes(c.optimizer, c.momentum);
  const int64_t state_bytes =
      checked_mul(psi, static_cast<int64_t>(b.param + b.grad + b.optimizer),
                  "--hidden-sizes model states", "use smaller --hidden-sizes");
  const int64_t memory = physical_memory_bytes();
  RZ_CHECK(state_bytes <= memory, "--hidden-sizes gives " << psi << " parameters, " << state_bytes
                                                          << " bytes of model states, more than "
                                                             "this machine's "
                                                          << memory
                                                          << " bytes of memory; use smaller "
                                                             "--hidden-sizes");
  const int64_t per_step =
      checked_mul(world_size, c.grad_accum_steps, "world_size x --grad-accum-steps",
                  "--grad-accum-steps must divide --global-batch-size / world_size");
  RZ_CHECK(c.global_batch_size % per_step == 0,
           "--global-batch-size " << c.global_batch_size << " is not divisible by world_size "
                                  << world_size << " x --grad-accum-steps " << c.grad_accum_steps
                                  << " = " << per_step
                                  << "; choose a global batch that is a multiple of " << per_step);
}

int64_t num_parameters(const std::vector<int64_t>& sizes, const std::string& flag) {
  int64_t total = 0;
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    const int64_t weights =
        checked_mul(sizes[i], sizes[i + 1], flag + " parameter count", "use smaller layer widths");
    total = checked_add(total, checked_add(weights, sizes[i + 1], flag + " parameter count"),
                        flag + " parameter count", "use smaller layer widths");
  }
  return total;
}

int64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return kMaxBytes;  // unknown: the 1 PiB sanity limit
  int64_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<int64_t>(pages), static_cast<int64_t>(page), &bytes))
    return kMaxBytes;
  return std::min(bytes, kMaxBytes);
}

int64_t total_steps_checked(int64_t epochs, int64_t steps_per_epoch, int64_t max_steps) {
  // With --max-steps the product only matters up to max_steps: epochs 2^63-1 is then fine.
  if (max_steps > 0 && steps_per_epoch > 0 && epochs >= (max_steps - 1) / steps_per_epoch + 1)
    return max_steps;
  return checked_mul(epochs, steps_per_epoch, "--epochs x steps per epoch",
                     "use fewer --epochs or set --max-steps");
}

void refuse_multi_process_launch(const std::string& program, const std::string& instead) {
  // SLURM_STEP_NUM_TASKS, not SLURM_NTASKS: srun sets it for the tasks it launches, while
  // SLURM_NTASKS describes the whole allocation (salloc -n 4, an sbatch script) and is set for
  // a single process started inside it too.
  for (const char* var :
       {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_STEP_NUM_TASKS"}) {
    const char* value = std::getenv(var);
    if (value == nullptr) continue;
    const long n = std::strtol(value, nullptr, 10);
    RZ_CHECK(n <= 1, program << " runs on one process, but the launcher started " << n << " ("
                             << var << "=" << value << "): each copy would "
                             << (instead.empty() ? "train alone and write the same files. Run it "
                                                   "without mpirun, or use ch03_data_parallel "
                                                   "(or a later chapter) for " +
                                                       std::to_string(n) + " ranks"
                                                 : instead));
  }
}

int parse_flags(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ExtrasError& e) {
    const auto refuse = [](const std::ostringstream& text) {  // one write: ranks interleave
      std::cerr << text.str() << std::flush;
      return static_cast<int>(CLI::ExitCodes::ExtrasError);
    };
    // "--no-shuffle false": a value after a flag, which takes none. CLI11 would only echo
    // "false"; the flag is named, with both ways to say what was meant.
    for (int i = 2; i < argc; ++i) {
      const CLI::Option* flag = app.get_option_no_throw(argv[i - 1]);
      if (flag == nullptr || flag->get_expected_max() != 0 || argv[i][0] == '-') continue;
      std::ostringstream text;
      text << argv[i - 1] << " is a flag and takes no value, so '" << argv[i]
           << "' after it is not expected: leave " << argv[i - 1] << " out to turn it off, or give "
           << argv[i - 1] << "=" << argv[i] << "\nRun with --help for more information.\n";
      return refuse(text);
    }
    // "--grad-accum-steps 4" to chapter 01: CLI11 lists the extras ("4 --grad-accum-steps");
    // the first extra that looks like a flag is named, with where this chapter's are listed.
    const std::string program = std::filesystem::path(argv[0]).filename().string();
    for (const std::string& arg : app.remaining()) {
      const std::string name = arg.substr(0, arg.find('='));
      if (name.size() < 2 || name[0] != '-' || name == "--" || (name[1] >= '0' && name[1] <= '9') ||
          name[1] == '.')
        continue;  // "--", a value (-1, -.5)
      const bool one_dash = name[1] != '-' && app.get_option_no_throw("-" + name) != nullptr;
      std::ostringstream text;
      text << program << " has no flag " << name
           << (one_dash ? " (did you mean -" + name + "?)"
                        : " (each chapter has the flags its lesson needs so far; later chapters "
                          "add theirs)")
           << ": " << program << " --help lists this one's\n";
      return refuse(text);
    }
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return -1;
}

}  // namespace ringzero
