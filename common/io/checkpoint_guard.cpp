// checkpoint_guard: what a checkpointed run refuses before it trains. At resume: a checkpoint
// written with other flags, for another model layout (check_resume_fits) or from another
// training set (check_same_data); before step 1: a --checkpoint-dir that cannot be written or
// that holds another run's checkpoints (Checkpointer::check_checkpoint_dir); before a tool
// writes a new checkpoint, its directory (check_new_checkpoint_dir). Split from
// checkpoint.cpp, which saves and loads (Checkpointer); the manifest's own field checks are in
// checkpoint_read.cpp (read_checkpoint).

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "common/comm/comm.hpp"
#include "common/core/check.hpp"
#include "common/driver/dist_config.hpp"
#include "common/io/checkpoint.hpp"
#include "common/io/checkpoint_format.hpp"

namespace fs = std::filesystem;

namespace ringzero {

namespace checkpoint_format {

void check_resume_fits(const nlohmann::json& m, const TrainConfig& config, const Model& model,
                       const std::string& mpath) {
  // The flags that give the state its meaning: refused when they differ.
  const nlohmann::json now = checkpoint_flags_that_must_match(config);
  static const std::vector<std::pair<std::string, std::string>> flag_of = {
      {"model", "--model"},        {"layer_sizes", "--model/--hidden-sizes"},
      {"data", "--data"},          {"optimizer", "--optimizer"},
      {"momentum", "--momentum"},  {"seed", "--seed"},
      {"shuffle", "--no-shuffle"}, {"global_batch_size", "--global-batch-size"},
      {"precision", "--precision"}};
  for (const auto& [key, flag] : flag_of) {  // in this order: the model first
    const nlohmann::json& value = now.at(key);
    const nlohmann::json saved = m.at("flags").value(key, nlohmann::json());
    std::string why;
    if (key == "global_batch_size")
      why =
          " (the position in the epoch counts global batches, and each step's samples are cut "
          "from its global batch: another size would train on other samples than the run that "
          "wrote it)";
    RZ_CHECK(saved == value, mpath << ": field flags." << key << " is " << saved.dump()
                                   << ", this run has " << flag << " " << value.dump() << why
                                   << ". Resume with the same " << flag << ", or start a new run");
  }
  const nlohmann::json fields = field_names(config);  // what this optimizer's state is
  RZ_CHECK(m.at("fields") == fields, mpath << ": field fields is " << m.at("fields").dump()
                                           << ", this run's --optimizer needs " << fields.dump()
                                           << ". Resume with the optimizer that wrote it");
  const auto& params = model.parameters();
  RZ_CHECK(m.at("num_parameters").get<int64_t>() == model.num_parameters(),
           mpath << ": field num_parameters is " << m.at("num_parameters") << ", this model has "
                 << model.num_parameters());
  const auto& tensors = m.at("tensors");
  RZ_CHECK(tensors.size() == params.size(), mpath << ": field tensors has " << tensors.size()
                                                  << " entries, this model " << params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& t = tensors[i];
    RZ_CHECK(
        t.at("name") == params[i]->name() && t.at("shape").get<Shape>() == params[i]->shape() &&
            t.at("offset").get<int64_t>() == model.offsets()[i],
        mpath << ": field tensors[" << i << "] is " << t.at("name") << " " << t.at("shape").dump()
              << " at " << t.at("offset") << ", this model has " << params[i]->name() << " "
              << shape_str(params[i]->shape()) << " at " << model.offsets()[i]);
  }
}

void check_same_data(const nlohmann::json& m, const nlohmann::json& now, const std::string& mpath) {
  if (!m.contains("data") || now.is_null()) return;
  const nlohmann::json& saved = m["data"];
  const bool same = saved.is_object() && saved.value("size", int64_t{-1}) == now.at("size") &&
                    saved.value("crc32", int64_t{-1}) == now.at("crc32");
  RZ_CHECK(same, mpath << ": field data is " << saved.dump() << ", this run's training set is "
                       << now.dump()
                       << ": other samples than the run that wrote it. Resume with the same "
                          "--data/--data-dir, or start a new run (--init-from for its weights)");
}

void check_same_checkpoint(Communicator* comm, const std::string& resume,
                           const nlohmann::json& m) {
  if (comm == nullptr) return;
  const std::string mine = step_dir_name(m.at("global_step").get<int64_t>()) +
                           " (manifest_crc32 " + json_str(m.at(kSealField)) + ")";
  const std::vector<std::string> all = comm->gather_strings(mine, 0);
  std::string verdict;
  for (size_t r = 1; r < all.size() && verdict.empty(); ++r)
    if (all[r] != all[0])
      verdict = "--resume " + resume + ": rank " + std::to_string(r) + " found " + all[r] +
                ", rank 0 found " + all[0] +
                "; every rank must resume from the same checkpoint (a node-local or stale "
                "directory?). Give every rank the same step_* directory";
  comm->broadcast_string(verdict, 0);
  RZ_CHECK(verdict.empty(), verdict);
}

void check_finite_state(const CheckpointData& ck, const std::string& mpath) {
  for (const auto& [field, values] : ck.fields) {
    const auto bad = std::find_if(values.begin(), values.end(),
                                  [](float v) { return !std::isfinite(v); });
    if (bad == values.end()) continue;
    const int64_t i = bad - values.begin();
    std::string where = "element " + std::to_string(i);
    for (const auto& t : ck.manifest.at("tensors")) {
      const int64_t off = t.at("offset").get<int64_t>(), n = t.at("numel").get<int64_t>();
      if (i >= off && i < off + n)
        where = t.at("name").get<std::string>() + "[" + std::to_string(i - off) + "]";
    }
    RZ_CHECK(false, mpath << ": the checkpoint's " << field << " hold " << *bad << " at " << where
                          << ": it was saved after the run that wrote it had diverged (its CRCs "
                             "are intact, so this is what it computed). Resume from an earlier "
                             "checkpoint, with a lower --lr or --clip-grad-norm");
  }
}

}  // namespace checkpoint_format

using namespace checkpoint_format;

void check_outside_checkpoints(const std::string& flag, const std::string& path,
                               const std::string& checkpoint_dir, const std::string& dir_name) {
  if (path.empty()) return;
  const OutputTarget target = resolve_output(flag, path);
  if (target.device) return;
  const fs::path out = fs::weakly_canonical(fs::absolute(target.path));
  const std::string holder = committed_checkpoint_holding(out.parent_path());
  RZ_CHECK(holder.empty(), flag << " " << path << " is inside the committed checkpoint " << holder
                                << ", where only the checkpointer writes (it would be pruned with "
                                   "it, or replace one of its files); write it elsewhere");
  if (checkpoint_dir.empty()) return;
  fs::path ck = fs::weakly_canonical(fs::absolute(checkpoint_dir));
  if (ck.filename().empty()) ck = ck.parent_path();  // "D/", before D exists: D
  RZ_CHECK(out != ck, flag << " " << path << " is " << dir_name << " " << checkpoint_dir
                           << "; give the output its own file");
  RZ_CHECK(out.parent_path() != ck || step_of_dir_name(out.filename().string()) < 0,
           flag << " " << path << " takes the name of a checkpoint step directory in " << dir_name
                << " " << checkpoint_dir
                << " (a later save, or --resume, would stop there); give another file name");
}

void check_outputs(const std::vector<OutputPath>& outputs, const std::string& checkpoint_dir,
                   const std::vector<std::pair<std::string, std::string>>& inputs,
                   const std::string& dir_name) {
  std::vector<std::pair<std::string, std::string>> all;  // the inputs that exist, the outputs
  for (const auto& input : inputs)
    if (file_kind(input.second) == "a regular file") all.push_back(input);  // else: its loader says
  for (const OutputPath& out : outputs) {
    check_output_path(out.flag, out.path, out.example_name);
    check_outside_checkpoints(out.flag, out.path, checkpoint_dir, dir_name);
    all.emplace_back(out.flag, out.path);
  }
  check_distinct_outputs(all);
}

void check_new_checkpoint_dir(const std::string& flag, const std::string& dir) {
  const fs::path d = fs::absolute(dir).lexically_normal();
  const std::string kind = file_kind(dir), holder = committed_checkpoint_holding(d);
  RZ_CHECK(kind.empty() || kind == "a directory",
           flag << " " << dir << " is " << kind << "; give a directory for the new checkpoint");
  RZ_CHECK(holder.empty(), flag << " " << dir << " is (or is inside) the committed checkpoint "
                                << holder << "; give a directory of its own");
  // The directory, or the nearest entry above it that exists (a dangling link counts: it is
  // where making the checkpoint's directories would fail), which must be a directory we can write.
  fs::path existing = d;
  std::error_code ec;  // an entry we may not look at: the checks below name it
  while (!fs::exists(fs::symlink_status(existing, ec)) && existing != existing.parent_path())
    existing = existing.parent_path();
  const std::string above = file_kind(existing.string());
  RZ_CHECK(above == "a directory", flag << " " << dir << ": " << existing.string() << " is "
                                        << (above.empty() ? "not readable" : above)
                                        << ", not a directory; give a directory");
  const std::string refused =
      file_creation_refused((existing / ".write-test").string(), "give a writable directory");
  RZ_CHECK(refused.empty(),
           flag << " " << dir << ": cannot write in " << existing.string() << " " << refused);
  if (kind.empty()) return;
  for (const auto& e : fs::directory_iterator(d))
    RZ_CHECK(step_of_dir_name(e.path().filename().string()) < 0,
             flag << " " << dir << " already holds " << e.path().filename().string()
                  << " (another run's checkpoints, which the new one would mix with); give an "
                     "empty or new directory");
}

void Checkpointer::check_checkpoint_dir() {
  if (config_.checkpoint_dir.empty()) return;
  check_on_every_rank(comm_, [&] { check_checkpoint_dir_here(); });
}

void Checkpointer::check_checkpoint_dir_here() {
  const fs::path d = config_.checkpoint_dir;
  // Checked before the directory is made: a refused one leaves nothing behind in a checkpoint.
  const std::string holder = committed_checkpoint_holding(d);
  RZ_CHECK(holder.empty(), "--checkpoint-dir " << config_.checkpoint_dir
                                               << " is (or is inside) a committed checkpoint ("
                                               << holder
                                               << "), where only the checkpointer of the run "
                                                  "that wrote it writes; give the directory that "
                                                  "holds the step_* directories, or another one");
  // Writable, now: not after the last step (F2's lost run). Created if missing.
  std::error_code ec;
  fs::create_directories(d, ec);
  RZ_CHECK(!ec && fs::is_directory(d),
           "--checkpoint-dir " << config_.checkpoint_dir << ": cannot create the directory ("
                               << (ec ? ec.message() : "a file of that name exists")
                               << "); give a directory in a writable place");
  // A unique name per probe (mkstemp): ranks on several nodes may share D.
  const std::string refused =
      file_creation_refused((d / ".write-test").string(), "give a writable directory");
  RZ_CHECK(refused.empty(),
           "--checkpoint-dir " << config_.checkpoint_dir << " is not writable " << refused);
  // Another run's checkpoints: a run that did not resume from this directory must not save
  // into it, since its saves would prune them (docs/checkpoints.md, "One directory, one run").
  std::error_code same_ec;
  fs::path from = resumed_dir_.empty() ? fs::path() : fs::absolute(resumed_dir_).lexically_normal();
  if (from.filename().empty()) from = from.parent_path();  // "D/step_X/"
  const bool resumed_here = !resumed_dir_.empty() && fs::equivalent(from.parent_path(), d, same_ec);
  int64_t newest = -1;
  for (const auto& e : fs::directory_iterator(d)) {
    const int64_t s = step_of_dir_name(e.path().filename().string());
    // A file where a step directory will go would fail that save, after its steps.
    RZ_CHECK(s < 0 || e.is_directory(), "--checkpoint-dir " << config_.checkpoint_dir << ": "
                                            << e.path().string()
                                            << " is not a directory, but has a checkpoint's "
                                               "name; move it away");
    if (s >= 0 && fs::exists(e.path() / kManifest)) newest = std::max(newest, s);
  }
  if (resumed_here) return;
  RZ_CHECK(newest < 0, "--checkpoint-dir "
                           << config_.checkpoint_dir
                           << " already holds committed checkpoints of another run (newest: "
                           << (d / step_dir_name(newest)).string() << ", step " << newest
                           << ") and this run "
                           << (resumed_dir_.empty() ? "does not resume from it"
                                                    : "resumes from " + resumed_dir_)
                           << "; its saves would mix with them and prune them. To continue "
                              "that run add --resume "
                           << config_.checkpoint_dir
                           << "; for a new run give another (or an empty) --checkpoint-dir");
}

}  // namespace ringzero
