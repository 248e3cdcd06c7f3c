// checkpoint_read: finding, reading and validating a checkpoint (resolve_checkpoint,
// read_checkpoint: every file named in the manifest, its size and CRC-32, the flags that must
// match), and consolidating it into one replicated state (consolidated_state_dict,
// write_replicated_checkpoint). Split from checkpoint.cpp, which writes them (Checkpointer).
#include <cctype>
#include <climits>
#include <cstdio>
#include <filesystem>

#include "checkpoint.hpp"
#include "checkpoint_format.hpp"
#include "safetensors.hpp"

namespace fs = std::filesystem;

namespace ringzero {

using namespace checkpoint_format;

namespace {

// Every manifest field read_checkpoint and Checkpointer::resume read, with its JSON type,
// checked before any is used: a valid JSON file with a missing or mistyped field (edited,
// or written by another tool) is refused naming the file and the field, not with
// nlohmann's "key not found" / "type must be number". Also bounds num_parameters by the
// tensors and the files' bytes, so a damaged count cannot allocate gigabytes on every rank.
void check_manifest_fields(const nlohmann::json& m, const std::string& mpath) {
  const fs::path dir = fs::path(mpath).parent_path();
  auto fail_field = [&](const std::string& field, const char* want) {
    RZ_CHECK(false, mpath << ": field " << field << " is missing or not " << want
                          << "; the manifest is damaged. Resume from another checkpoint");
  };
  auto integer = [&](const nlohmann::json& j, const std::string& key, const std::string& where,
                     int64_t min) {
    if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<int64_t>() < min)
      fail_field(where + key, min == 0 ? "an integer >= 0" : "an integer >= 1");
    return j[key].get<int64_t>();
  };
  auto array = [&](const nlohmann::json& j, const std::string& key, const std::string& where) {
    if (!j.contains(key) || !j[key].is_array()) fail_field(where + key, "an array");
  };
  auto string = [&](const nlohmann::json& j, const std::string& key, const std::string& where) {
    if (!j.contains(key) || !j[key].is_string()) fail_field(where + key, "a string");
  };
  const int64_t psi = integer(m, "num_parameters", "", 1);
  integer(m, "world_size", "", 1);
  integer(m, "global_step", "", 0);
  integer(m, "epoch", "", 1);
  integer(m, "position_in_epoch", "", 0);
  integer(m, "steps_per_epoch", "", 1);
  if (!m.contains("flags") || !m["flags"].is_object()) fail_field("flags", "an object");
  if (!m.contains("optimizer_state") || !m["optimizer_state"].is_object())
    fail_field("optimizer_state", "an object");
  if (m["optimizer_state"].value("type", "") == "sgd" &&
      !(m["optimizer_state"].contains("started") && m["optimizer_state"]["started"].is_boolean()))
    fail_field("optimizer_state.started", "a boolean");
  array(m, "fields", "");
  for (size_t i = 0; i < m["fields"].size(); ++i) {
    const auto& f = m["fields"][i];
    if (!f.is_string() ||
        (f != "params" && f != "exp_avg" && f != "exp_avg_sq" && f != "momentum_buffer"))
      fail_field("fields[" + std::to_string(i) + "]",
                 "one of params, exp_avg, exp_avg_sq, momentum_buffer");
  }
  if (std::find(m["fields"].begin(), m["fields"].end(), "params") == m["fields"].end())
    fail_field("fields", "a list holding \"params\"");
  array(m, "tensors", "");
  int64_t numel_sum = 0;
  for (size_t i = 0; i < m["tensors"].size(); ++i) {
    const auto& t = m["tensors"][i];
    const std::string where = "tensors[" + std::to_string(i) + "].";
    if (!t.is_object()) fail_field("tensors[" + std::to_string(i) + "]", "an object");
    string(t, "name", where);
    array(t, "shape", where);
    for (const auto& d : t["shape"])
      if (!d.is_number_integer() || d.get<int64_t>() < 0) fail_field(where + "shape", "integers");
    // The model's unpadded flat layout: tensors in registration order, back to back.
    if (integer(t, "offset", where, 0) != numel_sum)
      fail_field(where + "offset", ("the end of the tensor before it, " + std::to_string(numel_sum))
                                       .c_str());
    const int64_t n = integer(t, "numel", where, 0);
    if (t.contains("step") || m["optimizer_state"].value("type", "") == "adamw")
      integer(t, "step", where, 0);  // AdamW's per-tensor step count (bias correction)
    if (n > psi - numel_sum) fail_field(where + "numel", "within num_parameters");
    numel_sum += n;
  }
  RZ_CHECK(numel_sum == psi, mpath << ": field num_parameters is " << psi
                                   << " but the tensors' numel add up to " << numel_sum
                                   << "; the manifest is damaged. Resume from another checkpoint");
  array(m, "files", "");
  int64_t bytes = 0;
  for (size_t i = 0; i < m["files"].size(); ++i) {
    const auto& r = m["files"][i];
    const std::string where = "files[" + std::to_string(i) + "].";
    if (!r.is_object()) fail_field("files[" + std::to_string(i) + "]", "an object");
    string(r, "file", where);
    // A name in the checkpoint's directory: never a path that leaves it.
    const std::string name = r["file"].get<std::string>();
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
        name.find('\0') != std::string::npos)
      fail_field(where + "file", "a file name inside the checkpoint directory");
    string(r, "kind", where);
    const int64_t b = integer(r, "bytes", where, 0);
    if (!r.contains("crc32") || !r["crc32"].is_number_unsigned() ||
        r["crc32"].get<uint64_t>() > 0xffffffffull)
      fail_field(where + "crc32", "a 32-bit unsigned integer");
    if (r["kind"] == "flat") {
      array(r, "runs", where);
      for (const auto& run : r["runs"])
        if (!run.is_array() || run.size() != 3 ||
            !std::all_of(run.begin(), run.end(), [](const nlohmann::json& x) {
              return x.is_number_integer() && x.get<int64_t>() >= 0;
            }))
          fail_field(where + "runs", "[global offset, local offset, length] integers >= 0");
    } else if (r["kind"] != "state_dict") {
      fail_field(where + "kind", "\"flat\" or \"state_dict\"");
    }
    // The real size bounds what may be allocated (a recorded size is the manifest's word);
    // a size that differs from files[i].bytes is reported later, by name.
    const std::string path = (dir / name).string();
    RZ_CHECK(!file_kind(path).empty(), path << ": missing; " << fs::path(mpath).filename().string()
                                            << " lists it (files[" << i
                                            << "]). The checkpoint is incomplete: resume from "
                                               "another");
    check_input_file("checkpoint file", path, "a checkpoint's files are. Resume from another");
    const auto size = static_cast<int64_t>(std::min<uintmax_t>(fs::file_size(path), INT64_MAX / 4));
    RZ_CHECK(size == b, path << ": " << size << " bytes, but " << kManifest << " field files["
                             << name << "].bytes says " << b
                             << " (a partial or replaced shard). Resume from another checkpoint");
    bytes = std::min<int64_t>(bytes + size, INT64_MAX / 4);  // n files of at most 2^61 each
  }
  // Every field of every element is stored as 4 bytes in one of the files.
  const auto nfields = static_cast<int64_t>(m["fields"].size());
  RZ_CHECK(nfields == 0 || psi <= bytes / 4 / nfields,
           mpath << ": field num_parameters is " << psi << ", but the files hold " << bytes
                 << " bytes, too few for " << nfields
                 << " float32 fields of that many elements; the manifest is damaged. Resume "
                    "from another checkpoint");
}

// Where the 8 hex digits of field manifest_crc32 start in a manifest's text, or npos when the
// field is missing, given twice or not "XXXXXXXX". JSON escapes a quote inside a string, so the
// key in quotes can only be a key.
size_t seal_digits_at(const std::string& text) {
  const std::string key = std::string("\"") + kSealField + "\"";
  const size_t k = text.find(key);
  if (k == std::string::npos || text.find(key, k + 1) != std::string::npos) return std::string::npos;
  size_t i = k + key.size();
  auto skip_space = [&] {
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  };
  skip_space();
  if (i >= text.size() || text[i] != ':') return std::string::npos;
  ++i;
  skip_space();
  if (i + 10 > text.size() || text[i] != '"' || text[i + 9] != '"') return std::string::npos;
  for (size_t j = i + 1; j < i + 9; ++j)
    if (!std::isxdigit(static_cast<unsigned char>(text[j]))) return std::string::npos;
  return i + 1;
}

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

std::string checkpoint_format::seal_manifest(nlohmann::json manifest) {
  manifest[kSealField] = "00000000";
  std::string text = manifest.dump(2) + "\n";
  const size_t at = seal_digits_at(text);
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08x", crc32_of(text));
  text.replace(at, 8, hex);
  return text;
}

void checkpoint_format::check_manifest_seal(const std::string& text, const std::string& mpath) {
  const size_t at = seal_digits_at(text);
  RZ_CHECK(at != std::string::npos,
           mpath << ": field " << kSealField << " (8 hex digits, the manifest's own CRC-32) is "
                 << "missing, malformed or given twice; the manifest is damaged. Resume from "
                    "another checkpoint");
  std::string zeroed = text;
  zeroed.replace(at, 8, "00000000");
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08x", crc32_of(zeroed));
  RZ_CHECK(text.compare(at, 8, hex) == 0,
           mpath << ": field " << kSealField << " is " << text.substr(at, 8)
                 << ", but the manifest's text has CRC-32 " << hex
                 << " (edited or corrupted after it was written). Resume from another checkpoint");
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

CheckpointData read_checkpoint_manifest(const std::string& text, const std::string& dir) {
  CheckpointData ck;
  ck.dir = dir;
  const std::string mpath = (fs::path(dir) / kManifest).string();
  ck.manifest = parse_json_unique_keys(text, mpath);
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
    RZ_CHECK(covered[i] == 1, dir << ": element " << i << " of the model is held by " << covered[i]
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
  write_atomically((dir / kManifest).string(), seal_manifest(m), false);
}

}  // namespace ringzero
