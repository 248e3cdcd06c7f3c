// checkpoint_write: the two things Checkpointer::save (checkpoint.cpp) writes: each writer's
// safetensors file with its record, and rank 0's manifest (docs/checkpoints.md has the format).
#include <cstdio>
#include <filesystem>

#include "common/io/checkpoint.hpp"
#include "common/io/checkpoint_format.hpp"
#include "common/core/check.hpp"
#include "common/core/device_memory.hpp"
#include "common/io/safetensors.hpp"

namespace fs = std::filesystem;

namespace ringzero {

using namespace checkpoint_format;  // names, CRC-32, the writer (checkpoint_format.hpp)

namespace {

/// The replicated file's tensors: each of `fields` of every parameter, cut from state.pieces[0]
/// (the whole model) and named as PyTorch's state_dict() does. Errors: a field rank 0 does not
/// hold.
std::map<std::string, NamedTensor> replicated_tensors(const TrainingState& state,
                                                      const std::vector<std::string>& fields) {
  const Model& model = *state.model;
  const auto& params = model.parameters();
  std::map<std::string, NamedTensor> tensors;
  std::map<std::string, std::span<float>> spans = optimizer_fields(state.pieces.at(0));
  spans["params"] = state.pieces.at(0).params;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto off = static_cast<size_t>(model.offsets()[i]);
    for (const auto& f : fields) {
      RZ_CHECK(spans.count(f), "checkpoint: rank 0 holds no " << f << " to save");
      std::vector<float> v(static_cast<size_t>(params[i]->numel()));  // host or --device memory
      copy_elements(spans[f].subspan(off, v.size()), std::span<float>(v));
      tensors[tensor_key(params[i]->name(), f)] = {params[i]->shape(), std::move(v)};
    }
  }
  return tensors;
}

/// A shard file's tensors: one flat tensor per field of `fields`, this rank's pieces back to
/// back; appends each non-empty piece's run [global offset, offset in the file, length] to
/// `runs`. `rank` is for the error: a non-empty piece that does not hold a field.
std::map<std::string, NamedTensor> shard_tensors(const TrainingState& state,
                                                 const std::vector<std::string>& fields, int rank,
                                                 nlohmann::json& runs) {
  std::map<std::string, NamedTensor> tensors;
  for (const auto& f : fields) tensors[f].shape = {0};
  int64_t local = 0;
  for (const StatePiece& piece : state.pieces) {
    std::map<std::string, std::span<float>> spans = optimizer_fields(piece);
    spans["params"] = piece.params;
    for (const auto& f : fields) {
      // An empty shard (a bucket or layer with fewer elements than ranks) has no SGD
      // momentum buffer; it contributes nothing to any field.
      if (!spans.count(f) && piece.params.empty()) continue;
      RZ_CHECK(spans.count(f), "checkpoint: rank " << rank << "'s shard at global offset "
                                                   << piece.global_offset << " holds no " << f
                                                   << " to save");
      std::vector<float>& values = tensors[f].values;  // appended from host or --device memory
      values.resize(values.size() + spans[f].size());
      copy_elements(spans[f], std::span<float>(values).last(spans[f].size()));
    }
    if (!piece.params.empty())
      runs.push_back({piece.global_offset, local, static_cast<int64_t>(piece.params.size())});
    local += static_cast<int64_t>(piece.params.size());
  }
  for (const auto& f : fields) tensors[f].shape = {local};
  return tensors;
}

/// Adds the AdamW step count of each segment of state's pieces to `steps` (3 per parameter:
/// Σ t, Σ t², pieces). Pieces without step counts (SGD, no optimizer) add nothing.
void add_segment_steps(const TrainingState& state, std::vector<double>& steps) {
  for (const StatePiece& piece : state.pieces)
    if (const std::vector<int64_t>* seg_steps = segment_steps_of(piece))
      for (size_t k = 0; k < piece.segment_params.size(); ++k) {
        const auto t = static_cast<double>((*seg_steps)[k]);
        double* st = &steps[3 * piece.segment_params[k]];
        st[0] += t, st[1] += t * t, st[2] += 1;
      }
}

/// The manifest's field "tensors": every parameter's name, shape, offset and numel, and with
/// config.optimizer "adamw" its step count from `steps` (Σ t, Σ t², pieces, over all ranks).
/// Errors: an AdamW tensor whose pieces took different numbers of steps.
nlohmann::json tensor_records(const Model& model, const TrainConfig& config,
                              const std::vector<double>& steps) {
  const auto& params = model.parameters();
  nlohmann::json tensors = nlohmann::json::array();
  for (size_t i = 0; i < params.size(); ++i) {
    nlohmann::json t = {{"name", params[i]->name()},
                        {"shape", params[i]->shape()},
                        {"offset", model.offsets()[i]},
                        {"numel", params[i]->numel()}};
    const double* st = &steps[3 * i];
    if (config.optimizer == "adamw") {
      RZ_CHECK(st[2] > 0 && st[1] * st[2] == st[0] * st[0],
               "checkpoint: the pieces of " << params[i]->name()
                                            << " took different numbers of steps");
      t["step"] = static_cast<int64_t>(st[0] / st[2]);
    }
    tensors.push_back(t);
  }
  return tensors;
}

}  // namespace

nlohmann::json Checkpointer::write_state_file(const TrainingState& state, const fs::path& dir,
                                              const TrainPosition& pos,
                                              const std::vector<std::string>& fields,
                                              std::vector<double>& steps) const {
  std::map<std::string, NamedTensor> tensors;
  nlohmann::json runs = nlohmann::json::array();
  if (!state.sharded)
    tensors = replicated_tensors(state, fields);
  else
    tensors = shard_tensors(state, fields, rank_, runs);
  add_segment_steps(state, steps);
  char name[48];
  std::snprintf(name, sizeof name, "shard_%05d.safetensors", rank_);
  const std::string file = state.sharded ? name : kReplicatedFile;
  const std::string bytes = safetensors_bytes(tensors);
  write_atomically((dir / file).string(), bytes, kill_hook(pos.step, rank_));
  nlohmann::json record = {{"file", file},
                           {"rank", rank_},
                           {"kind", state.sharded ? "flat" : "state_dict"},
                           {"bytes", bytes.size()},
                           {"crc32", crc32_of(bytes)}};
  if (state.sharded) record["runs"] = runs;
  return record;
}

nlohmann::json Checkpointer::build_manifest(const TrainingState& state, const TrainPosition& pos,
                                            int64_t steps_per_epoch,
                                            const std::vector<std::string>& fields,
                                            const std::vector<double>& steps,
                                            const std::vector<std::string>& records) const {
  const Model& model = *state.model;
  nlohmann::json m;
  m["format"] = "ringzero-checkpoint";
  m["format_version"] = kCheckpointFormatVersion;
  m["chapter"] = state.chapter;
  m["world_size"] = world_size_;
  m["zero_stage"] = state.zero_stage;
  m["layout"] = state.layout;
  m["global_step"] = pos.step;
  m["epoch"] = pos.epoch;
  m["position_in_epoch"] = pos.t;
  m["steps_per_epoch"] = steps_per_epoch;
  m["sampler"] = {{"seed", config_.seed},
                  {"shuffle", !config_.no_shuffle},
                  {"global_batch_size", config_.global_batch_size},
                  {"rule",
                   "epoch e's order: Fisher-Yates on Rng(seed, stream e); step t uses "
                   "positions [t B, (t+1) B)"}};
  m["rng"] = {{"seed", config_.seed},
              {"note",
               "no random draws after initialisation: the sampler's order is a "
               "function of (seed, epoch), so the position is the whole RNG state"}};
  m["flags"] = checkpoint_flags_that_must_match(config_);
  if (!state.data.is_null()) m["data"] = state.data;
  m["flags_recorded"] = {{"lr", config_.lr},
                         {"weight_decay", config_.weight_decay},
                         {"clip_grad_norm", config_.clip_grad_norm},
                         {"grad_accum_steps", config_.grad_accum_steps},
                         {"epochs", config_.epochs},
                         {"max_steps", config_.max_steps}};
  m["num_parameters"] = model.num_parameters();
  m["fields"] = fields;
  if (config_.optimizer == "sgd") {
    bool started = false;
    for (const StatePiece& piece : state.pieces)
      if (piece.optimizer && piece.optimizer->sgd() && !piece.params.empty())
        started = started || piece.optimizer->sgd()->started();
    m["optimizer_state"] = {{"type", "sgd"}, {"started", started}};
  } else {
    m["optimizer_state"] = {{"type", "adamw"}};
  }
  if (state.scaler != nullptr)  // fp16: torch's state_dict() has scale, _growth_tracker too
    m["loss_scaler"] = {{"scale", state.scaler->scale()},
                        {"growth_tracker", state.scaler->growth_tracker()},
                        {"skipped_steps", state.scaler->skipped_steps()}};
  m["tensors"] = tensor_records(model, config_, steps);
  m["files"] = nlohmann::json::array();
  for (const auto& r : records)
    if (r != "null") m["files"].push_back(nlohmann::json::parse(r));
  return m;
}

}  // namespace ringzero
