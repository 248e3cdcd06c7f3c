// consolidate_checkpoint: one checkpoint (any chapter, any world size) as one PyTorch-loadable
// safetensors file, like DeepSpeed's zero_to_fp32.py. Run through scripts/consolidate.
//
//   consolidate_checkpoint D OUT.safetensors [--optimizer-state OPT.safetensors]
//                          [--as-checkpoint DIR]
//
// D is a step_* directory or a --checkpoint-dir (its newest committed checkpoint). OUT holds
// every parameter under its state_dict() name: torch's model.load_state_dict(
// safetensors.torch.load_file(OUT), strict=True) takes it. --optimizer-state writes the
// optimizer state as "<name>.exp_avg", "<name>.exp_avg_sq", "<name>.step" (AdamW) or
// "<name>.momentum_buffer" (SGD); --as-checkpoint writes the same state as a replicated
// checkpoint (world size 1) that any chapter can --resume from.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>

#include "common/core/check.hpp"
#include "common/driver/config.hpp"
#include "common/io/atomic_file.hpp"
#include "common/io/checkpoint.hpp"
#include "common/io/safetensors.hpp"

using namespace ringzero;
namespace fs = std::filesystem;

// --as-checkpoint DIR makes a new checkpoint: DIR must be a directory (or not exist yet) that
// holds no checkpoint and is none, nor lies inside one (its step directory would mix with
// another run's, or be written into the checkpoint being read).
static void check_as_checkpoint(const std::string& dir) {
  const fs::path d = fs::absolute(dir).lexically_normal();
  std::error_code ec;  // a directory we may not look into: the checks below name it
  const std::string kind = file_kind(dir);
  RZ_CHECK(kind.empty() || kind == "a directory",
           "--as-checkpoint " << dir << " is " << kind << "; give a directory for the new checkpoint");
  for (fs::path c = d; !c.empty() && c != c.parent_path(); c = c.parent_path())
    RZ_CHECK(c.filename().string().rfind("step_", 0) != 0 || !fs::exists(c / "manifest.json", ec),
             "--as-checkpoint " << dir << " is (or is inside) the committed checkpoint "
                                << c.string() << "; give a directory of its own");
  // The directory, or the nearest entry above it that exists (a dangling link counts: it is
  // where making the checkpoint's directories would fail), which must be a directory we can write.
  fs::path existing = d;
  while (!fs::exists(fs::symlink_status(existing, ec)) && existing != existing.parent_path())
    existing = existing.parent_path();
  const std::string above = file_kind(existing.string());
  RZ_CHECK(above == "a directory", "--as-checkpoint " << dir << ": " << existing.string() << " is "
                                                      << (above.empty() ? "not readable" : above)
                                                      << ", not a directory; give a directory");
  const std::string refused =
      file_creation_refused((existing / ".write-test").string(), "give a writable directory");
  RZ_CHECK(
      refused.empty(),  // before OUT is written, not after
      "--as-checkpoint " << dir << ": cannot write in " << existing.string() << " " << refused);
  if (kind.empty()) return;
  for (const auto& e : fs::directory_iterator(d))
    RZ_CHECK(e.path().filename().string().rfind("step_", 0) != 0,
             "--as-checkpoint " << dir << " already holds " << e.path().filename().string()
                                << " (another run's checkpoints, which the new one would mix "
                                   "with); give an empty or new directory");
}

// The directory that holds step directory `step_dir` (resolve_checkpoint's answer), however it
// was written: "ck/step_X/", "ck/step_X/.", "step_X" from inside ck, a link to it.
static std::string checkpoint_folder(const std::string& step_dir) {
  return fs::canonical(fs::absolute(step_dir)).parent_path().string();
}

int main(int argc, char** argv) {
  CLI::App app{"consolidate a RingZero checkpoint into one safetensors file"};
  std::string dir, out, optimizer_out, as_checkpoint;
  app.add_option("checkpoint", dir, "a step_* directory or a --checkpoint-dir")->required();
  app.add_option("out", out, "the model's parameters, safetensors with PyTorch names");
  app.add_option("--optimizer-state", optimizer_out, "also write the optimizer state here");
  app.add_option("--as-checkpoint", as_checkpoint,
                 "also write a replicated checkpoint (world size 1) into this directory");
  if (int rc = parse_flags(app, argc, argv); rc >= 0) return rc;
  return run_main([&] {
    refuse_multi_process_launch("consolidate_checkpoint",
                                "write the same files at once. Run scripts/consolidate without "
                                "mpirun: it reads every rank's shards itself");
    RZ_CHECK(!out.empty() || !optimizer_out.empty() || !as_checkpoint.empty(),
             "nothing to write: give OUT.safetensors, --optimizer-state or --as-checkpoint");
    const std::string resolved = resolve_checkpoint(dir, "the checkpoint");
    // Written whole or not at all, never over a FIFO or into a checkpoint (the one being read
    // included: its model.safetensors or manifest.json would be destroyed), nor under a step
    // directory's name in the --checkpoint-dir that holds it (a later --resume would stop at
    // it), one file each.
    check_outputs({{"OUT", out, "model.safetensors"},
                   {"--optimizer-state", optimizer_out, "optimizer.safetensors"}},
                  checkpoint_folder(resolved), {}, "the checkpoint's directory");
    if (!as_checkpoint.empty()) check_as_checkpoint(as_checkpoint);
    const CheckpointData ckpt = read_checkpoint(resolved);
    if (!out.empty()) {
      write_file_atomically(out, safetensors_bytes(consolidated_state_dict(ckpt, false)));
      std::printf("%s: %zu tensors, %lld parameters (from %s, world size %d, step %lld)\n",
                  out.c_str(), ckpt.manifest.at("tensors").size(),
                  static_cast<long long>(ckpt.manifest.at("num_parameters").get<int64_t>()),
                  resolved.c_str(), ckpt.manifest.at("world_size").get<int>(),
                  static_cast<long long>(ckpt.manifest.at("global_step").get<int64_t>()));
    }
    if (!optimizer_out.empty()) {
      auto all = consolidated_state_dict(ckpt, true);
      for (const auto& t : ckpt.manifest.at("tensors")) all.erase(t.at("name").get<std::string>());
      write_file_atomically(optimizer_out, safetensors_bytes(all));
      std::printf("%s: %zu optimizer tensors\n", optimizer_out.c_str(), all.size());
    }
    if (!as_checkpoint.empty()) {
      try {
        write_replicated_checkpoint(ckpt, as_checkpoint);
      } catch (const fs::filesystem_error& e) {  // read-only, full, no permission
        RZ_CHECK(false, "--as-checkpoint " << as_checkpoint << ": cannot write the checkpoint ("
                                           << e.code().message() << " at " << e.path1().string()
                                           << "); give a writable directory");
      }
      std::printf("%s: replicated checkpoint written\n", as_checkpoint.c_str());
    }
    return 0;
  });
}
