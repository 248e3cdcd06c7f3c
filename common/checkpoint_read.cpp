// checkpoint_read: finding, reading and validating a checkpoint (resolve_checkpoint,
// read_checkpoint: every file named in the manifest, its size and CRC-32, the flags that must
// match), and consolidating it into one replicated state (consolidated_state_dict,
// write_replicated_checkpoint). Split from checkpoint.cpp, which writes them (Checkpointer).
#include <filesystem>

#include "checkpoint.hpp"
#include "checkpoint_format.hpp"
#include "safetensors.hpp"

namespace fs = std::filesystem;

namespace ringzero {

using namespace checkpoint_format;

std::string resolve_checkpoint(const std::string& path) {
  RZ_CHECK(fs::exists(path), "--resume " << path << ": no such file or directory");
  if (fs::exists(fs::path(path) / kManifest)) return path;
  RZ_CHECK(fs::is_directory(path), "--resume " << path << " is not a checkpoint directory");
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
  RZ_CHECK(best >= 0,
           "--resume " << path << ": no committed checkpoint (no step_*/" << kManifest << ")"
                       << (uncommitted.empty()
                               ? std::string()
                               : "; without a manifest (interrupted writes):" + uncommitted)
                       << ". Point --resume at a --checkpoint-dir of an earlier run");
  return (fs::path(path) / step_dir_name(best)).string();
}

CheckpointData read_checkpoint(const std::string& dir) {
  CheckpointData ck;
  ck.dir = dir;
  const std::string mpath = (fs::path(dir) / kManifest).string();
  RZ_CHECK(fs::exists(mpath), mpath << ": missing; the checkpoint was never committed (a write "
                                       "was interrupted). Resume from an earlier checkpoint");
  try {
    ck.manifest = nlohmann::json::parse(read_file(mpath));
  } catch (const nlohmann::json::exception& e) {
    RZ_CHECK(false, mpath << ": not valid JSON (" << e.what() << ")");
  }
  const nlohmann::json& m = ck.manifest;
  RZ_CHECK(m.value("format", "") == "ringzero-checkpoint",
           mpath << ": field format is " << json_str(m.value("format", nlohmann::json("missing")))
                 << ", not ringzero-checkpoint");
  RZ_CHECK(m.contains("format_version") && m["format_version"] == kCheckpointFormatVersion,
           mpath << ": field format_version is "
                 << json_str(m.value("format_version", nlohmann::json("missing")))
                 << "; this binary reads version " << kCheckpointFormatVersion
                 << " only. Use the binary that wrote it");
  const int64_t psi = m.at("num_parameters").get<int64_t>();
  const auto fields = m.at("fields").get<std::vector<std::string>>();
  for (const auto& f : fields) ck.fields[f].assign(static_cast<size_t>(psi), 0.0f);
  std::vector<uint8_t> covered(static_cast<size_t>(psi), 0);
  for (const auto& rec : m.at("files")) {
    const std::string name = rec.at("file").get<std::string>();
    const std::string path = (fs::path(dir) / name).string();
    RZ_CHECK(fs::exists(path), path << ": missing; " << kManifest << " lists it (rank "
                                    << rec.value("rank", 0)
                                    << "). The checkpoint is incomplete: resume from another");
    const auto size = static_cast<int64_t>(fs::file_size(path));
    RZ_CHECK(size == rec.at("bytes").get<int64_t>(),
             path << ": " << size << " bytes, but " << kManifest << " field files[" << name
                  << "].bytes says " << rec.at("bytes").get<int64_t>()
                  << " (a partial or replaced shard). Resume from another checkpoint");
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
    auto cover = [&](int64_t begin, int64_t n) {
      RZ_CHECK(begin >= 0 && n >= 0 && begin + n <= psi,
               path << ": range [" << begin << ", " << begin + n << ") outside the model's " << psi
                    << " elements");
      for (int64_t i = begin; i < begin + n; ++i) covered[i]++;
    };
    if (rec.at("kind") == "state_dict") {
      for (const auto& t : m.at("tensors")) {
        const std::string tname = t.at("name").get<std::string>();
        const int64_t off = t.at("offset").get<int64_t>(), n = t.at("numel").get<int64_t>();
        cover(off, n);
        for (const auto& f : fields) {
          const auto& v = get(tensor_key(tname, f), n);
          std::copy(v.begin(), v.end(), ck.fields[f].begin() + off);
        }
      }
    } else {
      int64_t local = 0;
      for (const auto& run : rec.at("runs")) local += run.at(2).get<int64_t>();
      for (const auto& f : fields) {
        const auto& v = get(f, local);
        for (const auto& run : rec.at("runs")) {
          const int64_t g = run.at(0), l = run.at(1), n = run.at(2);
          RZ_CHECK(l >= 0 && l + n <= local, path << ": run " << run.dump() << " out of range");
          std::copy_n(v.begin() + l, n, ck.fields[f].begin() + g);
        }
      }
      for (const auto& run : rec.at("runs")) cover(run.at(0), run.at(2));
    }
  }
  for (int64_t i = 0; i < psi; ++i)
    RZ_CHECK(covered[i] == 1, dir << ": element " << i << " of the model is held by " << +covered[i]
                                  << " files (must be exactly 1): the files do not match "
                                  << kManifest << " field files");
  return ck;
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
  write_atomically((dir / kManifest).string(), m.dump(2) + "\n", false);
}

}  // namespace ringzero
