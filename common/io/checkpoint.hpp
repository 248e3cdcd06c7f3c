// checkpoint: save the whole training state, resume it bit for bit, at the same or another
// world size, and consolidate it into one PyTorch-loadable file (docs/checkpoints.md).
//
// A checkpoint is a directory D/step_SSSSSSSS holding
//  - replicated chapters (01-05): model.safetensors, written by rank 0: every parameter under
//    its PyTorch state_dict() name, the optimizer state as "<name>.exp_avg", "<name>.exp_avg_sq"
//    (AdamW) or "<name>.momentum_buffer" (SGD);
//  - ZeRO chapters (06-08): shard_RRRRR.safetensors per rank: the flat tensors "params",
//    "exp_avg", "exp_avg_sq" / "momentum_buffer" of the real (unpadded) elements the rank owns;
//  - manifest.json: format version, world size, the chapter's bucket/layer layout and padding,
//    every tensor's name, shape, global offset and AdamW step count, each file's byte size,
//    CRC-32 and runs (global offset, offset in the file's flat tensors, length), the global step,
//    epoch and position in the epoch, the sampler state and the flags that must match.
// Every offset is in the model's unpadded flat layout (nn.hpp's registration order), which does
// not depend on the world size or the chapter: that is what makes resharding N -> N' and
// 05 <-> 06/07/08 a matter of copying ranges (as DeepSpeed's universal checkpoints and
// zero_to_fp32.py, and torch.distributed.checkpoint's global offsets).
//
// Commit protocol (collective): every writer writes its file to NAME.tmp, fsyncs it, renames it
// to NAME and fsyncs the directory; rank 0 gathers the file records and writes manifest.json the
// same way, last. A checkpoint exists only once its manifest does, so a crash at any moment
// leaves the previous checkpoint whole; --resume D ignores directories without a manifest.
// Then rank 0 keeps the newest --keep-checkpoints K and removes the rest.
// A 16-bit run saves the same fields: "params" are its fp32 master weights, with their AdamW
// moments, and fp16's loss scaler goes to the manifest; resuming rounds the 16-bit parameters
// from the masters, as each step does: bit for bit at the same world size, and at another one
// the same loaded state, as in fp32.
// Leaves out: asynchronous saving, object stores, files in dtypes other than float32.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/core/nn.hpp"
#include "common/driver/config.hpp"
#include "common/driver/train.hpp"
#include "common/io/safetensors.hpp"
#include "common/precision/grad_scaler.hpp"
#include "common/precision/mixed.hpp"

namespace ringzero {

class Communicator;

/// The checkpoint format this binary writes and the only one it reads.
/// 2: the manifest carries its own CRC-32 (field manifest_crc32).
inline constexpr int kCheckpointFormatVersion = 2;

/// One optimizer's share of the training state on this rank: `optimizer` updates `params`,
/// which are elements [global_offset, global_offset + params.size()) of the model's unpadded
/// flat layout; segment k of the optimizer belongs to parameter segment_params[k]. In a 16-bit
/// run `master` takes the optimizer's place and `params` are its fp32 master weights (what the
/// checkpoint's "params" hold in every precision, as PyTorch's AMP keeps fp32 parameters). Both
/// may be null (chapter 03's ranks other than 0 hold no optimizer).
struct StatePiece {
  std::span<float> params;
  int64_t global_offset = 0;
  Optimizer* optimizer = nullptr;
  std::vector<int> segment_params;
  MasterWeights* master = nullptr;
};

/// What a chapter hands the checkpointer: its model (names, shapes, offsets) and its pieces.
struct TrainingState {
  const Model* model = nullptr;
  std::vector<StatePiece> pieces;
  /// false: the state is the same on every rank (chapters 01-05), rank 0 writes one file;
  /// true: every rank writes its own shard file (ZeRO).
  bool sharded = false;
  /// true: every Parameter::data holds the whole parameter on every rank (01-07), so loading
  /// writes every parameter, not only the pieces (ZeRO-3 keeps only its pieces).
  bool params_replicated = true;
  std::string chapter;
  int zero_stage = 0;
  nlohmann::json layout;  ///< the chapter's bucket/layer layout and padding, for the manifest
  /// The training set's fingerprint {"source", "size", "crc32"} (Dataset, as verify_same_data
  /// compares it): written to the manifest's field "data", compared at resume. null: none.
  nlohmann::json data;
  /// fp16: the loss scaler, saved in the manifest's field "loss_scaler" and restored (the same
  /// on every rank). null outside fp16.
  GradScaler* scaler = nullptr;
  /// 16 bits: sets the lesson's 16-bit parameters from the checkpoint's fp32 "params" (Ψ, the
  /// model's unpadded flat layout; each rank takes what it holds), rounded to nearest even as
  /// every step rounds the master weights. Empty in fp32: the pieces, and with params_replicated
  /// every Parameter::data, are loaded as they are.
  std::function<void(std::span<const float>)> load_params;
};

/// The replicated chapters' state: the whole model and `optimizer` (or none).
TrainingState replicated_state(const Model& model, Optimizer* optimizer, std::string chapter);

/// Where the training loop stands: `step` optimizer steps done; the next step is position `t`
/// (0-based, in global batches) of epoch `epoch` (1-based).
struct TrainPosition {
  int64_t step = 0;
  int64_t epoch = 1;
  int64_t t = 0;
};

/// A checkpoint read from disk and put together in the model's unpadded flat layout.
struct CheckpointData {
  std::string dir;
  nlohmann::json manifest;
  /// "params", "exp_avg", "exp_avg_sq" or "momentum_buffer": Ψ elements each.
  std::map<std::string, std::vector<float>> fields;
};

/// The committed checkpoint `path` names: a directory with manifest.json, or the newest
/// committed step_* directory below it. Errors: path missing, nothing committed in it (names
/// the directories without a manifest), each naming `flag`, the option that gave the path.
std::string resolve_checkpoint(const std::string& path, const std::string& flag = "--resume");

/// Reads and checks a committed checkpoint: a known format_version, every file present with the
/// manifest's size and CRC-32, each field covered exactly once. Errors name the file and field.
CheckpointData read_checkpoint(const std::string& dir);

/// read_checkpoint with the manifest's text given (`text`, as read from dir/manifest.json):
/// the JSON (each key once), the format version, the manifest's own CRC-32
/// (checkpoint_format.hpp: seal_manifest), every field's type and range, then each file it
/// lists, every range checked before a byte is copied. tests/fuzz/fuzz_manifest.cpp feeds it.
CheckpointData read_checkpoint_manifest(const std::string& text, const std::string& dir);

/// The full model as one state dict with PyTorch names; with optimizer = true, the optimizer
/// state too, as "<name>.exp_avg", "<name>.exp_avg_sq", "<name>.step" (or ".momentum_buffer").
std::map<std::string, NamedTensor> consolidated_state_dict(const CheckpointData& ckpt,
                                                           bool optimizer);

/// Writes `ckpt` as a committed replicated checkpoint (one model.safetensors + manifest) in
/// out_dir/step_SSSSSSSS, world size 1: what scripts/consolidate --as-checkpoint makes.
void write_replicated_checkpoint(const CheckpointData& ckpt, const std::string& out_dir);

/// Before write_replicated_checkpoint: `dir` (given by `flag`) must be a directory, or not exist
/// yet under one a file can be created in, that is no committed checkpoint nor lies inside one
/// and holds no step directory (the new one would mix with another run's, or be written into
/// the checkpoint being read). Errors name the flag, the path and the fix.
void check_new_checkpoint_dir(const std::string& flag, const std::string& dir);

/// Refuses an output (`flag` `path`, e.g. --save-final) that would land inside a committed
/// checkpoint (a directory holding a manifest: only the checkpointer writes there, and a file
/// added to it would be pruned with it or mistaken for one of its shards), that is
/// `checkpoint_dir` itself, or that takes a step directory's name in it (a later save would
/// fail there). Errors name the flag, the path and the checkpoint; `dir_name` is what they call
/// `checkpoint_dir` ("the --checkpoint-dir" for a run, "the checkpoint's directory" for a tool).
void check_outside_checkpoints(const std::string& flag, const std::string& path,
                               const std::string& checkpoint_dir,
                               const std::string& dir_name = "the --checkpoint-dir");

/// An output a run will write: the flag that names it, the path given (empty: off), and a
/// file name of its kind for the fix when the path is a directory ("trace.json" for --trace).
struct OutputPath {
  std::string flag, path, example_name;
};

/// Before anything is written: each output passes check_output_path and
/// check_outside_checkpoints, and no two of the outputs and `inputs` (files read, e.g.
/// --init-from, as (flag, path)) land on one file (check_distinct_outputs). Empty paths are
/// outputs turned off. Errors name the flag, the path and the fix; `dir_name` is what they
/// call `checkpoint_dir` (check_outside_checkpoints).
void check_outputs(const std::vector<OutputPath>& outputs, const std::string& checkpoint_dir,
                   const std::vector<std::pair<std::string, std::string>>& inputs = {},
                   const std::string& dir_name = "the --checkpoint-dir");

/// --checkpoint-dir / --checkpoint-every / --keep-checkpoints / --resume for one run.
class Checkpointer {
 public:
  /// comm: null in the single-process chapters. Errors: --resume with --init-from,
  /// --checkpoint-every without --checkpoint-dir, negative values.
  Checkpointer(const TrainConfig& config, Communicator* comm);

  /// Collective. With --resume: reads the checkpoint, refuses one that does not fit (the
  /// manifest's flags, tensor names and sizes, format version), loads parameters and optimizer
  /// state into `state` and returns the position to continue from. Without: {0, 1, 0}.
  TrainPosition resume(TrainingState& state, int64_t steps_per_epoch);

  /// Collective, before the first step, after resume(): on every rank (each writes its own
  /// shard there, and with node-local directories each sees its own D), --checkpoint-dir D is
  /// created if missing and must accept a new file; it must hold no committed checkpoint unless
  /// this run resumed from one in D (then every checkpoint in D is of this run's lineage, and
  /// pruning them is safe). One rank's failure stops every rank (check_on_every_rank), naming
  /// the rank, D, the newest checkpoint found and the fix (--resume D, another D).
  void check_checkpoint_dir();

  /// Collective; call after every optimizer step: saves when `step` is a multiple of
  /// --checkpoint-every, or is the last step of the run (total_steps).
  void after_step(const TrainingState& state, int64_t step, int64_t epoch, int64_t t_next,
                  int64_t steps_per_epoch, int64_t total_steps);

  /// Collective: writes checkpoint D/step_SSSSSSSS for position `pos` and prunes old ones.
  void save(const TrainingState& state, const TrainPosition& pos, int64_t steps_per_epoch);

 private:
  const TrainConfig& config_;
  Communicator* comm_;
  int rank_ = 0, world_size_ = 1;
  int64_t last_saved_ = -1;
  std::string resumed_dir_;  ///< the checkpoint resume() loaded, or ""

  void check_checkpoint_dir_here();  ///< this rank's part of check_checkpoint_dir
  /// resume()'s second half: the checked checkpoint `ck` into `state`.
  TrainPosition load(const CheckpointData& ck, const std::string& mpath, TrainingState& state,
                     int64_t steps_per_epoch);
  /// save()'s write on a writer rank (checkpoint_write.cpp): this rank's file (model.safetensors,
  /// or its shard_RRRRR.safetensors when state.sharded) for `fields`, written atomically in
  /// `dir`; adds its pieces' AdamW step counts to `steps` (Σ t, Σ t², pieces per tensor).
  /// Returns the file's record for the manifest. Errors: a field a piece does not hold.
  nlohmann::json write_state_file(const TrainingState& state, const std::filesystem::path& dir,
                                  const TrainPosition& pos, const std::vector<std::string>& fields,
                                  std::vector<double>& steps) const;
  /// save()'s manifest on rank 0 (checkpoint_write.cpp), unsealed: the run, position, flags,
  /// optimizer state, tensors (step counts from `steps`, summed over the ranks) and the files'
  /// `records` (JSON text, "null" from a rank that wrote none). Errors: an AdamW tensor whose
  /// pieces took different numbers of steps.
  nlohmann::json build_manifest(const TrainingState& state, const TrainPosition& pos,
                                int64_t steps_per_epoch, const std::vector<std::string>& fields,
                                const std::vector<double>& steps,
                                const std::vector<std::string>& records) const;
  /// save()'s pruning on rank 0, after checkpoint `step` is committed: removes committed
  /// checkpoints newer than it, all but the newest --keep-checkpoints K, and interrupted writes
  /// of other steps in --checkpoint-dir.
  void prune_checkpoints(int64_t step) const;
};

/// The flags that give the saved state its meaning; a resume with any other value is refused.
nlohmann::json checkpoint_flags_that_must_match(const TrainConfig& config);

}  // namespace ringzero
