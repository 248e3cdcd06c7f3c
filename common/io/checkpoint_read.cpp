// checkpoint_read: finding and reading a checkpoint (resolve_checkpoint, read_checkpoint: the
// manifest checked by checkpoint_manifest.cpp, then every file it names, its CRC-32 and ranges),
// and consolidating it into one replicated state (consolidated_state_dict,
// write_replicated_checkpoint). Split from checkpoint.cpp, which writes them (Checkpointer).
#include <filesystem>

#include "common/io/checkpoint.hpp"
#include "common/io/checkpoint_format.hpp"
#include "common/io/safetensors.hpp"

namespace fs = std::filesystem;

namespace ringzero {

using namespace checkpoint_format;

namespace {

// One record of the manifest's field files: its file is read (its CRC-32 checked) and its
// values copied into ck.fields, every range checked against the model
// and the file's tensors BEFORE a byte is copied; `covered` counts the files holding each element.
void copy_file_record(const nlohmann::json& rec, CheckpointData& ck,
                      const std::vector<std::string>& fields, std::vector<int64_t>& covered) {
  const nlohmann::json& m = ck.manifest;
  const int64_t psi = static_cast<int64_t>(covered.size());
  const std::string name = rec.at("file").get<std::string>();
  const std::string path = (fs::path(ck.dir) / name).string();
  // check_manifest_fields saw it: a regular file of files[i].bytes; the CRC-32 covers the rest.
  const std::string bytes = read_file(path);
  RZ_CHECK(crc32_of(bytes) == rec.at("crc32").get<uint32_t>(),
           path << ": CRC-32 " << crc32_of(bytes) << " differs from " << kManifest
                << " field files[" << name << "].crc32 = " << rec.at("crc32").get<uint32_t>()
                << " (corrupted). Resume from another checkpoint");
  const auto tensors = load_safetensors(path);
  auto get = [&](const std::string& key, int64_t numel) -> const std::vector<float>& {
    auto it = tensors.find(key);
    RZ_CHECK(it != tensors.end(), path << ": no tensor " << key << ", which " << kManifest
                                       << " field fields promises");
    RZ_CHECK(static_cast<int64_t>(it->second.values.size()) == numel,
             path << ": tensor " << key << " has " << it->second.values.size() << " elements, "
                  << kManifest << " says " << numel);
    return it->second.values;
  };
  // [begin, begin + n) within the model's psi elements (written so that nothing overflows).
  auto check_range = [&](int64_t begin, int64_t n) {
    RZ_CHECK(begin >= 0 && n >= 0 && n <= psi && begin <= psi - n,
             path << ": range [" << begin << ", " << begin << " + " << n << ") outside the model's "
                  << psi << " elements; " << kManifest << " is damaged. Resume from another");
    for (int64_t i = begin; i < begin + n; ++i) covered[i]++;
  };
  if (rec.at("kind") == "state_dict") {
    for (const auto& t : m.at("tensors")) {
      const int64_t off = t.at("offset").get<int64_t>(), n = t.at("numel").get<int64_t>();
      check_range(off, n);
      for (const auto& f : fields) {
        const auto& v = get(tensor_key(t.at("name").get<std::string>(), f), n);
        std::copy(v.begin(), v.end(), ck.fields[f].begin() + off);
      }
    }
    return;
  }
  int64_t local = 0;  // elements in the file's flat tensors: every run checked first
  for (const auto& run : rec.at("runs")) {
    const int64_t g = run.at(0), l = run.at(1), n = run.at(2);
    check_range(g, n);
    RZ_CHECK(l == local, path << ": run " << run.dump() << " starts at " << l << " in the file; "
                              << "runs tile the file's tensors in order, so it must start at "
                              << local << ". " << kManifest << " is damaged");
    local += n;  // <= psi per run, and at most psi in all (each element once, checked later)
    RZ_CHECK(local <= psi, path << ": runs hold more than the model's " << psi << " elements");
  }
  for (const auto& f : fields) {
    const auto& v = get(f, local);
    for (const auto& run : rec.at("runs"))
      std::copy_n(v.begin() + run.at(1).get<int64_t>(), run.at(2).get<int64_t>(),
                  ck.fields[f].begin() + run.at(0).get<int64_t>());
  }
}

}  // namespace

std::string resolve_checkpoint(const std::string& path, const std::string& flag) {
  RZ_CHECK(fs::exists(path), flag << " " << path << ": no such file or directory");
  if (fs::exists(fs::path(path) / kManifest)) return path;
  RZ_CHECK(fs::is_directory(path), flag << " " << path << " is not a checkpoint directory");
  // A step_* directory itself: read_checkpoint names its missing manifest.
  if (step_of_dir_name(fs::path(path).lexically_normal().filename().string()) >= 0) return path;
  int64_t best = -1;
  std::string uncommitted;
  for (const auto& e : fs::directory_iterator(path)) {
    const int64_t s = step_of_dir_name(e.path().filename().string());
    if (s < 0 || !e.is_directory()) continue;
    if (fs::exists(e.path() / kManifest))
      best = std::max(best, s);
    else
      uncommitted += " " + e.path().filename().string();
  }
  RZ_CHECK(best >= 0, flag << " " << path << ": no committed checkpoint (no step_*/" << kManifest
                           << ")"
                           << (uncommitted.empty()
                                   ? std::string()
                                   : "; without a manifest (interrupted writes):" + uncommitted)
                           << ". Point " << flag << " at a --checkpoint-dir of an earlier run");
  return (fs::path(path) / step_dir_name(best)).string();
}

CheckpointData read_checkpoint(const std::string& dir) {
  const std::string mpath = (fs::path(dir) / kManifest).string();
  RZ_CHECK(!file_kind(mpath).empty(),
           mpath << ": missing; the checkpoint was never committed (a write was interrupted). "
                    "Resume from an earlier checkpoint");
  // A FIFO or device would block or never end the read below.
  check_input_file("checkpoint manifest", mpath,
                   "a checkpoint's manifest is one. Resume from a real checkpoint");
  return read_checkpoint_manifest(read_file(mpath), dir);
}

namespace {

CheckpointData read_checked_manifest(const std::string& text, CheckpointData ck,
                                     const std::string& mpath) {
  const nlohmann::json& m = ck.manifest;
  RZ_CHECK(m.is_object(), mpath << ": not a JSON object; the manifest is damaged");
  RZ_CHECK(m.value("format", "") == "ringzero-checkpoint",
           mpath << ": field format is " << json_str(m.value("format", nlohmann::json("missing")))
                 << ", not ringzero-checkpoint");
  RZ_CHECK(m.contains("format_version") && m["format_version"] == kCheckpointFormatVersion,
           mpath << ": field format_version is "
                 << json_str(m.value("format_version", nlohmann::json("missing")))
                 << "; this binary reads version " << kCheckpointFormatVersion
                 << " only. Use the binary that wrote it");
  check_manifest_seal(text, mpath);
  check_manifest_fields(m, mpath);
  const int64_t psi = m.at("num_parameters").get<int64_t>();
  const auto fields = m.at("fields").get<std::vector<std::string>>();
  for (const auto& f : fields) ck.fields[f].assign(static_cast<size_t>(psi), 0.0f);
  std::vector<int64_t> covered(static_cast<size_t>(psi), 0);  // files holding each element
  for (const auto& rec : m.at("files")) copy_file_record(rec, ck, fields, covered);
  for (int64_t i = 0; i < psi; ++i)
    RZ_CHECK(covered[i] == 1, ck.dir << ": element " << i << " of the model is held by "
                                     << covered[i] << " files (must be exactly 1): the files do "
                                     << "not match " << kManifest << " field files");
  return ck;
}

}  // namespace

CheckpointData read_checkpoint_manifest(const std::string& text, const std::string& dir) {
  CheckpointData ck;
  ck.dir = dir;
  const std::string mpath = (fs::path(dir) / kManifest).string();
  ck.manifest = parse_json_unique_keys(text, mpath);
  try {
    return read_checked_manifest(text, std::move(ck), mpath);
  } catch (const nlohmann::json::exception& e) {  // a field of a type this binary never writes
    RZ_CHECK(false, mpath << ": a field is missing or of another type than this binary writes ("
                          << e.what() << "); the manifest is damaged. Resume from another "
                                         "checkpoint");
  }
  return {};
}


std::map<std::string, NamedTensor> consolidated_state_dict(const CheckpointData& ck,
                                                           bool optimizer) {
  std::map<std::string, NamedTensor> out;
  for (const auto& t : ck.manifest.at("tensors")) {
    const std::string name = t.at("name").get<std::string>();
    const int64_t off = t.at("offset").get<int64_t>(), n = t.at("numel").get<int64_t>();
    const Shape shape = t.at("shape").get<Shape>();
    for (const auto& [field, values] : ck.fields) {
      if (field != "params" && !optimizer) continue;
      out[tensor_key(name, field)] = {shape, {values.begin() + off, values.begin() + off + n}};
    }
    if (optimizer && t.contains("step"))  // torch.optim.AdamW's state["step"], a float tensor
      out[name + ".step"] = {{1}, {static_cast<float>(t.at("step").get<int64_t>())}};
  }
  return out;
}

void write_replicated_checkpoint(const CheckpointData& ck, const std::string& out_dir) {
  nlohmann::json m = ck.manifest;
  const int64_t step = m.at("global_step").get<int64_t>();
  const fs::path dir = fs::path(out_dir) / step_dir_name(step);
  fs::create_directories(dir);
  std::map<std::string, NamedTensor> tensors;
  for (const auto& t : m.at("tensors")) {
    const std::string name = t.at("name").get<std::string>();
    const int64_t off = t.at("offset").get<int64_t>(), n = t.at("numel").get<int64_t>();
    for (const auto& [field, values] : ck.fields)
      tensors[tensor_key(name, field)] = {t.at("shape").get<Shape>(),
                                          {values.begin() + off, values.begin() + off + n}};
  }
  const std::string bytes = safetensors_bytes(tensors);
  write_atomically((dir / kReplicatedFile).string(), bytes, false);
  m["world_size"] = 1;
  m["zero_stage"] = 0;
  m["layout"] = {{"kind", "replicated"}, {"consolidated_from", ck.dir}};
  m["files"] = nlohmann::json::array({{{"file", kReplicatedFile},
                                       {"rank", 0},
                                       {"kind", "state_dict"},
                                       {"bytes", bytes.size()},
                                       {"crc32", crc32_of(bytes)}}});
  write_atomically((dir / kManifest).string(), seal_manifest(m), false);
}

}  // namespace ringzero
