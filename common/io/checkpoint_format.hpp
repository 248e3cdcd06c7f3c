// checkpoint_format: the pieces of the on-disk checkpoint format that writing
// (checkpoint.cpp: Checkpointer) and reading (checkpoint_read.cpp: resolve, read and validate,
// consolidate) share: file and directory names, CRC-32, field names, the one atomic writer; and
// the resume checks Checkpointer::resume calls (checkpoint_guard.cpp).
// Internal to common/ (docs/checkpoints.md describes the format; checkpoint.hpp is the API).
#pragma once

#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/core/check.hpp"
#include "common/core/nn.hpp"
#include "common/core/optim.hpp"
#include "common/driver/config.hpp"
#include "common/driver/train.hpp"
#include "common/io/atomic_file.hpp"
#include "common/io/checkpoint.hpp"

namespace ringzero::checkpoint_format {

inline constexpr const char* kManifest = "manifest.json";
inline constexpr const char* kReplicatedFile = "model.safetensors";

inline std::string step_dir_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(step));
  return name;
}

// step_SSSSSSSS -> SSSSSSSS, or -1 for any other name. 8 digits or more: step_dir_name pads to
// 8 and writes step 100000000 on with 9 (up to 18: int64_t).
inline int64_t step_of_dir_name(const std::string& name) {
  if (name.size() < 13 || name.size() > 23 || name.rfind("step_", 0) != 0) return -1;
  int64_t s = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    s = s * 10 + (name[i] - '0');
  }
  return s;
}

// The committed checkpoint that holds `path` (the path itself or any directory above it, after
// the links in it are followed: a link to a checkpoint leads into it): a step_* directory with a
// manifest.json; "" when none does.
inline std::string committed_checkpoint_holding(const std::filesystem::path& path) {
  std::error_code ec;  // where the real path cannot be had (a part we may not look at): as written
  std::filesystem::path p = std::filesystem::weakly_canonical(std::filesystem::absolute(path), ec);
  if (ec) p = std::filesystem::absolute(path).lexically_normal();
  for (std::filesystem::path d = p; !d.empty() && d != d.root_path(); d = d.parent_path()) {
    std::error_code unreadable;  // a directory we may not look into holds nothing we know of
    if (step_of_dir_name(d.filename().string()) >= 0 &&
        std::filesystem::exists(d / kManifest, unreadable))
      return d.string();
    if (d == d.parent_path()) break;
  }
  return "";
}

inline uint32_t crc32_of(const std::string& bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  size_t done = 0;
  while (done < bytes.size()) {  // zlib takes uInt lengths
    const auto n = static_cast<uInt>(std::min<size_t>(bytes.size() - done, 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(bytes.data() + done), n);
    done += n;
  }
  return static_cast<uint32_t>(crc);
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  RZ_CHECK(in, "cannot read " << path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The optimizer's state of a piece as named flat spans, parallel to its params: AdamW's
// moments (an fp32 optimizer's, or the master weights' in 16 bits) or SGD's momentum buffer.
inline std::map<std::string, std::span<float>> optimizer_fields(const StatePiece& piece) {
  std::map<std::string, std::span<float>> out;
  if (piece.master != nullptr) {
    out["exp_avg"] = piece.master->exp_avg();
    out["exp_avg_sq"] = piece.master->exp_avg_sq();
  } else if (piece.optimizer == nullptr) {
  } else if (AdamW* a = piece.optimizer->adamw()) {
    out["exp_avg"] = a->exp_avg();
    out["exp_avg_sq"] = a->exp_avg_sq();
  } else if (SGD* s = piece.optimizer->sgd(); s && !s->momentum_buffer().empty()) {
    out["momentum_buffer"] = s->momentum_buffer();
  }
  return out;
}

// AdamW's step count per segment of a piece (bias correction), or null (SGD, no optimizer).
inline std::vector<int64_t>* segment_steps_of(const StatePiece& piece) {
  if (piece.master != nullptr) return &piece.master->segment_steps();
  if (piece.optimizer != nullptr && piece.optimizer->adamw() != nullptr)
    return &piece.optimizer->adamw()->segment_steps();
  return nullptr;
}

inline std::vector<std::string> field_names(const TrainConfig& c) {
  if (c.optimizer == "adamw") return {"params", "exp_avg", "exp_avg_sq"};
  if (c.momentum > 0) return {"params", "momentum_buffer"};
  return {"params"};
}

// "<name>.exp_avg" etc. in the replicated file and the consolidated optimizer state.
inline std::string tensor_key(const std::string& name, const std::string& field) {
  return field == "params" ? name : name + "." + field;
}

// Every checkpoint file goes through common/io/atomic_file's writer; kill_halfway is the fault
// test's crash in the middle of a write (RINGZERO_TEST_KILL_IN_CHECKPOINT, kill_hook below).
inline void write_atomically(const std::string& path, const std::string& bytes, bool kill_halfway) {
  write_file_atomically(path, bytes,
                        {.advice = ". The previous checkpoint is untouched: free space or point "
                                   "--checkpoint-dir elsewhere",
                         .kill_halfway = kill_halfway});
}

// The test hook RINGZERO_TEST_KILL_IN_CHECKPOINT=STEP:RANK.
inline bool kill_hook(int64_t step, int rank) {
  const char* env = std::getenv("RINGZERO_TEST_KILL_IN_CHECKPOINT");
  if (env == nullptr) return false;
  long long s = -1;
  int r = -1;
  return std::sscanf(env, "%lld:%d", &s, &r) == 2 && s == step && r == rank;
}

// The manifest's own checksum (format version 2): field "manifest_crc32" holds 8 hex digits,
// the CRC-32 of the manifest's text with those 8 digits written as "00000000". Computed over
// the text, not over a re-serialisation of the JSON, so that any tool can check or re-seal a
// manifest (tests/chapters/lib.bash: reseal_manifest) and the value does not depend on how a
// JSON library prints numbers. seal_manifest returns the text to write; check_manifest_seal
// refuses a text whose field is missing, given twice or malformed, or whose CRC differs (an
// edited step count, flag or range), naming `mpath`, both values and the fix.
inline constexpr const char* kSealField = "manifest_crc32";
// check_manifest_fields: every manifest field read_checkpoint and Checkpointer::resume read, with
// its JSON type and range, checked before any is used (a valid JSON file with a missing or
// mistyped field is refused naming `mpath` and the field, not with nlohmann's "key not found");
// the files it lists exist as regular files of their recorded sizes, and those sizes bound
// num_parameters, so a damaged count cannot allocate gigabytes on every rank.
void check_manifest_fields(const nlohmann::json& m, const std::string& mpath);
std::string seal_manifest(nlohmann::json manifest);
void check_manifest_seal(const std::string& text, const std::string& mpath);

inline std::string json_str(const nlohmann::json& j) {
  return j.is_string() ? j.get<std::string>() : j.dump();
}

// Checkpointer::resume's refusals (checkpoint_guard.cpp), after read_checkpoint has checked the
// manifest's fields and types. check_resume_fits: the manifest `m` (at `mpath`) must have
// config's checkpoint_flags_that_must_match, in that order (the model first), then model's
// num_parameters and every tensor's name, shape and offset; errors name the field, both values
// and the fix. check_same_data: the training set's fingerprint (Dataset::crc32 and size, as
// verify_same_data compares across ranks), recorded in the manifest's field "data", must equal
// `now`: another data set of the same shape (other files in --data-dir, relabelled samples) is
// refused, naming both. A manifest without the field (written before it existed), or a null
// `now`, is not checked.
void check_resume_fits(const nlohmann::json& m, const TrainConfig& config, const Model& model,
                       const std::string& mpath);
void check_same_data(const nlohmann::json& m, const nlohmann::json& now, const std::string& mpath);
// check_same_checkpoint: collective; every rank resolved --resume `resume` itself (a stale
// listing on a shared file system, or node-local directories, can give ranks different
// checkpoints): each rank's step and manifest CRC must equal rank 0's, or every rank stops,
// naming both. comm null: nothing to compare.
void check_same_checkpoint(Communicator* comm, const std::string& resume, const nlohmann::json& m);
// check_finite_state: every value of every field the checkpoint `ck` holds is finite; a NaN or
// infinity (a checkpoint saved after the run that wrote it had diverged) is refused naming the
// field, the tensor and the index, instead of being reported as a divergence of this run.
void check_finite_state(const CheckpointData& ck, const std::string& mpath);

}  // namespace ringzero::checkpoint_format
