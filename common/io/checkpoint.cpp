#include "common/io/checkpoint.hpp"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "common/comm/comm.hpp"
#include "common/core/check.hpp"
#include "common/core/device_memory.hpp"
#include "common/io/checkpoint_format.hpp"
#include "common/io/safetensors.hpp"

namespace fs = std::filesystem;

namespace ringzero {

using namespace checkpoint_format;  // names, CRC-32, the writer (checkpoint_format.hpp)

nlohmann::json checkpoint_flags_that_must_match(const TrainConfig& c) {
  return {{"model", c.model},
          {"layer_sizes", c.layer_sizes()},
          {"data", c.dataset()},
          {"optimizer", c.optimizer},
          {"momentum", c.optimizer == "sgd" ? c.momentum : 0.0f},
          {"seed", c.seed},
          {"shuffle", !c.no_shuffle},
          {"global_batch_size", c.global_batch_size},
          {"precision", c.precision}};
}

TrainingState replicated_state(const Model& model, Optimizer* optimizer, std::string chapter) {
  TrainingState s;
  s.model = &model;
  StatePiece piece;
  piece.params = const_cast<Model&>(model).params_memory.span();
  piece.optimizer = optimizer;
  for (size_t i = 0; i < model.parameters().size(); ++i)
    piece.segment_params.push_back(static_cast<int>(i));
  s.pieces.push_back(std::move(piece));
  s.chapter = std::move(chapter);
  s.layout = {{"kind", "replicated"}};
  return s;
}

Checkpointer::Checkpointer(const TrainConfig& c, Communicator* comm) : config_(c), comm_(comm) {
  if (comm) rank_ = comm->rank(), world_size_ = comm->world_size();
  RZ_CHECK(c.checkpoint_every >= 0,
           "--checkpoint-every " << c.checkpoint_every << " must be >= 0 (0: no checkpoints)");
  RZ_CHECK(c.keep_checkpoints >= 0,
           "--keep-checkpoints " << c.keep_checkpoints << " must be >= 0 (0: keep all)");
  RZ_CHECK(c.checkpoint_every == 0 || !c.checkpoint_dir.empty(),
           "--checkpoint-every " << c.checkpoint_every
                                 << " needs --checkpoint-dir D (where to write them)");
  RZ_CHECK(c.keep_checkpoints == 0 || !c.checkpoint_dir.empty(),
           "--keep-checkpoints " << c.keep_checkpoints
                                 << " needs --checkpoint-dir D (the checkpoints it keeps)");
  RZ_CHECK(c.resume.empty() || c.init_from.empty(),
           "--resume " << c.resume << " and --init-from " << c.init_from
                       << " both set the parameters; give one of them");
}

TrainPosition Checkpointer::resume(TrainingState& state, int64_t steps_per_epoch) {
  if (config_.resume.empty()) return {};
  const std::string dir = resolve_checkpoint(config_.resume);
  CheckpointData ck = read_checkpoint(dir);
  const std::string mpath = (fs::path(dir) / kManifest).string();
  check_same_checkpoint(comm_, config_.resume, ck.manifest);  // on every rank (checkpoint_guard)
  try {
    return load(ck, mpath, state, steps_per_epoch);
  } catch (const nlohmann::json::exception& e) {  // a field of a type this binary never writes
    RZ_CHECK(false, mpath << ": a field is missing or of another type than this binary writes ("
                          << e.what()
                          << "); the manifest is damaged. Resume from another "
                             "checkpoint");
  }
  return {};
}

TrainPosition Checkpointer::load(const CheckpointData& ck, const std::string& mpath,
                                 TrainingState& state, int64_t steps_per_epoch) {
  const std::string& dir = ck.dir;
  const nlohmann::json& m = ck.manifest;
  check_resume_fits(m, config_, *state.model, mpath);  // flags, model layout (checkpoint_guard)
  check_finite_state(ck, mpath);
  const Model& model = *state.model;
  const auto& params = model.parameters();
  const auto& tensors = m.at("tensors");
  // Load: every piece's parameters and optimizer state from the global layout.
  for (StatePiece& piece : state.pieces) {
    if (piece.params.empty()) continue;  // a shard of padding only
    const auto g = static_cast<size_t>(piece.global_offset);
    const std::span<const float> saved = ck.fields.at("params");  // into host or device memory
    copy_elements(saved.subspan(g, piece.params.size()), piece.params);
    for (auto& [field, span] : optimizer_fields(piece))
      copy_elements(std::span<const float>(ck.fields.at(field)).subspan(g, span.size()), span);
    if (std::vector<int64_t>* steps = segment_steps_of(piece))
      for (size_t k = 0; k < steps->size(); ++k)
        (*steps)[k] = tensors[piece.segment_params[k]].at("step").get<int64_t>();
    if (SGD* s = piece.optimizer ? piece.optimizer->sgd() : nullptr)
      s->set_started(m.at("optimizer_state").at("started").get<bool>());
  }
  if (state.scaler != nullptr) {  // fp16 (the flags matched: the manifest has one)
    const nlohmann::json& ls = m.at("loss_scaler");
    state.scaler->load_state(ls.at("scale").get<float>(), ls.at("growth_tracker").get<int64_t>(),
                             ls.at("skipped_steps").get<int64_t>());
  }
  if (state.load_params)  // 16 bits: the 16-bit parameters, rounded from the master weights
    state.load_params(ck.fields.at("params"));
  else if (state.params_replicated)
    for (size_t i = 0; i < params.size(); ++i)
      copy_elements(
          std::span<const float>(ck.fields.at("params"))
              .subspan(static_cast<size_t>(model.offsets()[i]), params[i]->data.span().size()),
          params[i]->data.span());
  TrainPosition pos{m.at("global_step").get<int64_t>(), m.at("epoch").get<int64_t>(),
                    m.at("position_in_epoch").get<int64_t>()};
  RZ_CHECK(m.at("steps_per_epoch").get<int64_t>() == steps_per_epoch,
           mpath << ": field steps_per_epoch is " << m.at("steps_per_epoch") << ", this run has "
                 << steps_per_epoch << " (another data set size?)");
  check_same_data(m, state.data, mpath);
  // The directory's name is what --resume D and the pruning sort by: it must be the step.
  fs::path dir_path = fs::path(dir).lexically_normal();
  if (dir_path.filename().empty()) dir_path = dir_path.parent_path();  // "D/step_X/"
  const int64_t named = step_of_dir_name(dir_path.filename().string());
  RZ_CHECK(named < 0 || named == pos.step,
           dir << " is named for step " << named << ", but " << kManifest
               << " field global_step is " << pos.step
               << " (renamed or swapped directories?). Rename it to " << step_dir_name(pos.step)
               << ", or resume from another checkpoint");
  resumed_dir_ = dir;
  if (pos.t >= steps_per_epoch) pos.epoch += 1, pos.t = 0;  // saved at an epoch's last step
  print0("resumed from " + dir + " (" + m.value("chapter", "?") + ", world size " +
         std::to_string(m.at("world_size").get<int>()) + "): " + std::to_string(pos.step) +
         " steps done, continuing at epoch " + std::to_string(pos.epoch) + ", position " +
         std::to_string(pos.t) + " of " + std::to_string(steps_per_epoch));
  last_saved_ = pos.step;
  return pos;
}

void Checkpointer::after_step(const TrainingState& state, int64_t step, int64_t epoch,
                              int64_t t_next, int64_t steps_per_epoch, int64_t total_steps) {
  if (config_.checkpoint_dir.empty() || step == last_saved_) return;
  const bool every = config_.checkpoint_every > 0 && step % config_.checkpoint_every == 0;
  if (every || step == total_steps) save(state, {step, epoch, t_next}, steps_per_epoch);
}

void Checkpointer::save(const TrainingState& state, const TrainPosition& pos,
                        int64_t steps_per_epoch) {
  const Model& model = *state.model;
  const auto& params = model.parameters();
  const fs::path dir = fs::path(config_.checkpoint_dir) / step_dir_name(pos.step);
  if (rank_ == 0) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    RZ_CHECK(!ec, "cannot create " << dir.string() << ": " << ec.message()
                                   << "; check --checkpoint-dir is writable");
    fs::remove(dir / kManifest, ec);  // re-saving a step: uncommitted until the new manifest
  }
  if (comm_) comm_->barrier();
  const std::vector<std::string> fields = field_names(config_);
  // Step counts per tensor (AdamW): Σ t, Σ t², pieces, over every rank's segments.
  std::vector<double> steps(3 * params.size(), 0.0);
  const bool writer = state.sharded || rank_ == 0;
  nlohmann::json record;
  if (writer) record = write_state_file(state, dir, pos, fields, steps);
  if (comm_) comm_->all_reduce_metrics(steps);
  std::vector<std::string> records{record.dump()};
  if (comm_) records = comm_->gather_strings(record.dump(), 0);
  if (rank_ == 0) {
    const nlohmann::json m = build_manifest(state, pos, steps_per_epoch, fields, steps, records);
    write_atomically((dir / kManifest).string(), seal_manifest(m), false);  // the commit
    print0("checkpoint " + dir.string() + " committed (step " + std::to_string(pos.step) + ")");
    prune_checkpoints(pos.step);
  }
  last_saved_ = pos.step;
  if (comm_) comm_->barrier();
}

void Checkpointer::prune_checkpoints(int64_t step) const {
  // Keep the newest K committed checkpoints; drop older ones and older interrupted writes.
  std::vector<std::pair<int64_t, fs::path>> committed, interrupted;
  for (const auto& e : fs::directory_iterator(config_.checkpoint_dir)) {
    const int64_t s = step_of_dir_name(e.path().filename().string());
    if (s < 0 || !e.is_directory()) continue;
    (fs::exists(e.path() / kManifest) ? committed : interrupted).emplace_back(s, e.path());
  }
  std::sort(committed.rbegin(), committed.rend());
  // Newer than this one: left by a run that was resumed from an earlier checkpoint. They
  // are another history, and --resume D must find this one as the newest.
  while (!committed.empty() && committed.front().first > step) {
    fs::remove_all(committed.front().second);
    committed.erase(committed.begin());
  }
  if (config_.keep_checkpoints > 0)
    for (size_t i = static_cast<size_t>(config_.keep_checkpoints); i < committed.size(); ++i)
      fs::remove_all(committed[i].second);
  for (const auto& [s, p] : interrupted)
    if (s != step) fs::remove_all(p);
}

}  // namespace ringzero
