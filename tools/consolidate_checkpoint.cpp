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
    if (!as_checkpoint.empty()) check_new_checkpoint_dir("--as-checkpoint", as_checkpoint);
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
