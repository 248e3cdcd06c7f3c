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

#include "common/check.hpp"
#include "common/checkpoint.hpp"
#include "common/safetensors.hpp"

using namespace ringzero;
namespace fs = std::filesystem;

// An output file must not be one of the checkpoint's own files (or anything in its directory):
// writing model.safetensors or manifest.json there would destroy the checkpoint being read.
// Its directory must exist (the writer would otherwise blame a --checkpoint-dir this tool
// does not have).
static void check_output(const char* what, const std::string& path, const std::string& ckpt) {
  if (path.empty()) return;
  const fs::path out = fs::weakly_canonical(fs::absolute(path));
  const fs::path src = fs::weakly_canonical(fs::absolute(ckpt));
  RZ_CHECK(out.parent_path() != src && out != src,
           what << " " << path << " is inside the checkpoint " << ckpt
                << " being read (it would overwrite or mix with its files); write it elsewhere");
  const fs::path dir = fs::path(path).parent_path();
  RZ_CHECK(dir.empty() || fs::is_directory(dir),
           what << " " << path << ": directory " << dir.string()
                << " does not exist; create it or write elsewhere");
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
    RZ_CHECK(!out.empty() || !optimizer_out.empty() || !as_checkpoint.empty(),
             "nothing to write: give OUT.safetensors, --optimizer-state or --as-checkpoint");
    const std::string resolved = resolve_checkpoint(dir);
    check_output("OUT", out, resolved);
    check_output("--optimizer-state", optimizer_out, resolved);
    const CheckpointData ckpt = read_checkpoint(resolved);
    if (!out.empty()) {
      atomic_write_file(out, safetensors_bytes(consolidated_state_dict(ckpt, false)));
      std::printf("%s: %zu tensors, %lld parameters (from %s, world size %d, step %lld)\n",
                  out.c_str(), ckpt.manifest.at("tensors").size(),
                  static_cast<long long>(ckpt.manifest.at("num_parameters").get<int64_t>()),
                  resolved.c_str(), ckpt.manifest.at("world_size").get<int>(),
                  static_cast<long long>(ckpt.manifest.at("global_step").get<int64_t>()));
    }
    if (!optimizer_out.empty()) {
      auto all = consolidated_state_dict(ckpt, true);
      for (const auto& t : ckpt.manifest.at("tensors")) all.erase(t.at("name").get<std::string>());
      atomic_write_file(optimizer_out, safetensors_bytes(all));
      std::printf("%s: %zu optimizer tensors\n", optimizer_out.c_str(), all.size());
    }
    if (!as_checkpoint.empty()) {
      write_replicated_checkpoint(ckpt, as_checkpoint);
      std::printf("%s: replicated checkpoint written\n", as_checkpoint.c_str());
    }
    return 0;
  });
}
