// checkpoint_manifest: the checks of a checkpoint's manifest before anything it says is used:
// every field's presence, JSON type and range (check_manifest_fields), and the manifest's own
// CRC-32 (seal_manifest, check_manifest_seal). Used by checkpoint_read.cpp (read_checkpoint)
// and, for the seal, by every writer of a manifest; docs/checkpoints.md has the format.
#include <cctype>
#include <cfloat>
#include <climits>
#include <cstdio>
#include <cmath>
#include <filesystem>
#include <set>

#include "common/io/checkpoint_format.hpp"

namespace fs = std::filesystem;

namespace ringzero::checkpoint_format {

namespace {

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

/// check_manifest_fields' check of one field: its presence, JSON type and range, each error
/// naming the manifest `mpath`, the field and what it must be.
struct FieldCheck {
  const std::string& mpath;

  /// Refuses `field` (its path in the manifest): it is missing or not `want`. Always throws.
  void fail_field(const std::string& field, const char* want) const {
    RZ_CHECK(false, mpath << ": field " << field << " is missing or not " << want
                          << "; the manifest is damaged. Resume from another checkpoint");
  }
  /// j[key], field `where` + key, as an integer >= `min` (0 or 1). Errors: missing, not an
  /// integer, below `min`.
  int64_t integer(const nlohmann::json& j, const std::string& key, const std::string& where,
                  int64_t min) const {
    if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<int64_t>() < min)
      fail_field(where + key, min == 0 ? "an integer >= 0" : "an integer >= 1");
    return j[key].get<int64_t>();
  }
  /// j[key], field `where` + key, is an array. Errors: missing or not one.
  void array(const nlohmann::json& j, const std::string& key, const std::string& where) const {
    if (!j.contains(key) || !j[key].is_array()) fail_field(where + key, "an array");
  }
  /// j[key], field `where` + key, is a string. Errors: missing or not one.
  void string(const nlohmann::json& j, const std::string& key, const std::string& where) const {
    if (!j.contains(key) || !j[key].is_string()) fail_field(where + key, "a string");
  }
};

/// The fp16 manifest `m`'s field loss_scaler: an object, its scale a power of two in float's
/// normal range, its growth_tracker below the growth interval, its skipped_steps >= 0.
/// Errors (via `check`) name the first field that is not.
void check_loss_scaler(const FieldCheck& check, const nlohmann::json& m) {
  if (!m.contains("loss_scaler") || !m["loss_scaler"].is_object())
    check.fail_field("loss_scaler", "an object (an fp16 run's)");
  const nlohmann::json& ls = m["loss_scaler"];
  // A power of two in float's normal range: every scaling by it, or by its inverse, is exact
  // (grad_scaler.hpp), as a scale only ever grown by 2 and halved from 2^16 is.
  const double scale = ls.contains("scale") && ls["scale"].is_number() ? ls["scale"].get<double>()
                                                                        : -1.0;
  int exponent = 0;
  if (!(scale >= FLT_MIN && scale <= FLT_MAX) || std::frexp(scale, &exponent) != 0.5)
    check.fail_field("loss_scaler.scale", "a power of two within float's normal range");
  if (check.integer(ls, "growth_tracker", "loss_scaler.", 0) >= GradScalerOptions{}.growth_interval)
    check.fail_field("loss_scaler.growth_tracker",
                     ("below the growth interval, " +
                      std::to_string(GradScalerOptions{}.growth_interval))
                         .c_str());
  check.integer(ls, "skipped_steps", "loss_scaler.", 0);
}

/// The manifest `m`'s field fields: an array of known field names holding "params".
/// Errors (via `check`): not an array, an unknown entry (named by index), no "params".
void check_field_names(const FieldCheck& check, const nlohmann::json& m) {
  check.array(m, "fields", "");
  for (size_t i = 0; i < m["fields"].size(); ++i) {
    const auto& f = m["fields"][i];
    if (!f.is_string() ||
        (f != "params" && f != "exp_avg" && f != "exp_avg_sq" && f != "momentum_buffer"))
      check.fail_field("fields[" + std::to_string(i) + "]",
                       "one of params, exp_avg, exp_avg_sq, momentum_buffer");
  }
  if (std::find(m["fields"].begin(), m["fields"].end(), "params") == m["fields"].end())
    check.fail_field("fields", "a list holding \"params\"");
}

/// The manifest `m`'s field tensors: each an object with a unique name, a shape of integers
/// >= 0, its numel (the shape's product) and an offset right after the tensor before it (with
/// AdamW, a step count); together exactly `psi` (num_parameters) elements. Errors (via
/// `check`) name the tensor's index and field; the last names both totals.
void check_tensors(const FieldCheck& check, const nlohmann::json& m, int64_t psi) {
  check.array(m, "tensors", "");
  int64_t numel_sum = 0;
  std::set<std::string> names;
  for (size_t i = 0; i < m["tensors"].size(); ++i) {
    const auto& t = m["tensors"][i];
    const std::string where = "tensors[" + std::to_string(i) + "].";
    if (!t.is_object()) check.fail_field("tensors[" + std::to_string(i) + "]", "an object");
    check.string(t, "name", where);
    check.array(t, "shape", where);
    int64_t shape_numel = 1;  // the shape's product, saturated: a huge shape cannot wrap
    for (const auto& d : t["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0)
        check.fail_field(where + "shape", "integers");
      const int64_t n = d.get<int64_t>();
      shape_numel = n != 0 && shape_numel > INT64_MAX / n ? INT64_MAX : shape_numel * n;
    }
    const std::string tname = t["name"].get<std::string>();
    if (tname == "__metadata__" || !names.insert(tname).second)
      check.fail_field(where + "name", "a tensor name given once (and not __metadata__)");
    // The model's unpadded flat layout: tensors in registration order, back to back.
    if (check.integer(t, "offset", where, 0) != numel_sum)
      check.fail_field(where + "offset",
                       ("the end of the tensor before it, " + std::to_string(numel_sum)).c_str());
    const int64_t n = check.integer(t, "numel", where, 0);
    if (n != shape_numel) check.fail_field(where + "numel", "the product of its shape");
    if (t.contains("step") || m["optimizer_state"].value("type", "") == "adamw")
      check.integer(t, "step", where, 0);  // AdamW's per-tensor step count (bias correction)
    if (n > psi - numel_sum) check.fail_field(where + "numel", "within num_parameters");
    numel_sum += n;
  }
  RZ_CHECK(numel_sum == psi, check.mpath << ": field num_parameters is " << psi
                                         << " but the tensors' numel add up to " << numel_sum
                                         << "; the manifest is damaged. Resume from another "
                                            "checkpoint");
}

/// Entry `i` of the manifest's field files (`r`): an object naming a file inside the
/// checkpoint directory `dir`, its kind (with "flat", its runs), bytes and CRC-32; the file
/// exists, is a regular file and has the recorded size. Returns its size (at most INT64_MAX / 4).
/// Errors (via `check`) name the entry's index and field, or the file.
int64_t check_file(const FieldCheck& check, const nlohmann::json& r, size_t i,
                   const fs::path& dir) {
  const std::string& mpath = check.mpath;
  const std::string where = "files[" + std::to_string(i) + "].";
  if (!r.is_object()) check.fail_field("files[" + std::to_string(i) + "]", "an object");
  check.string(r, "file", where);
  // A name in the checkpoint's directory: never a path that leaves it.
  const std::string name = r["file"].get<std::string>();
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos)
    check.fail_field(where + "file", "a file name inside the checkpoint directory");
  check.string(r, "kind", where);
  const int64_t b = check.integer(r, "bytes", where, 0);
  if (!r.contains("crc32") || !r["crc32"].is_number_unsigned() ||
      r["crc32"].get<uint64_t>() > 0xffffffffull)
    check.fail_field(where + "crc32", "a 32-bit unsigned integer");
  if (r["kind"] == "flat") {
    check.array(r, "runs", where);
    for (const auto& run : r["runs"])
      if (!run.is_array() || run.size() != 3 ||
          !std::all_of(run.begin(), run.end(), [](const nlohmann::json& x) {
            return x.is_number_integer() && x.get<int64_t>() >= 0;
          }))
        check.fail_field(where + "runs", "[global offset, local offset, length] integers >= 0");
  } else if (r["kind"] != "state_dict") {
    check.fail_field(where + "kind", "\"flat\" or \"state_dict\"");
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
  return size;
}

}  // namespace

// Every manifest field read_checkpoint and Checkpointer::resume read, with its JSON type,
// checked before any is used: a valid JSON file with a missing or mistyped field (edited,
// or written by another tool) is refused naming the file and the field, not with
// nlohmann's "key not found" / "type must be number". Also bounds num_parameters by the
// tensors and the files' bytes, so a damaged count cannot allocate gigabytes on every rank.
void check_manifest_fields(const nlohmann::json& m, const std::string& mpath) {
  const fs::path dir = fs::path(mpath).parent_path();
  const FieldCheck check{mpath};
  const int64_t psi = check.integer(m, "num_parameters", "", 1);
  check.integer(m, "world_size", "", 1);
  check.integer(m, "global_step", "", 0);
  check.integer(m, "epoch", "", 1);
  check.integer(m, "position_in_epoch", "", 0);
  check.integer(m, "steps_per_epoch", "", 1);
  if (!m.contains("flags") || !m["flags"].is_object()) check.fail_field("flags", "an object");
  if (!m.contains("optimizer_state") || !m["optimizer_state"].is_object())
    check.fail_field("optimizer_state", "an object");
  if (m["optimizer_state"].value("type", "") == "sgd" &&
      !(m["optimizer_state"].contains("started") && m["optimizer_state"]["started"].is_boolean()))
    check.fail_field("optimizer_state.started", "a boolean");
  if (m["flags"].value("precision", "") == "fp16")  // the loss scaler's state (fp16 only)
    check_loss_scaler(check, m);
  check_field_names(check, m);
  check_tensors(check, m, psi);
  check.array(m, "files", "");
  int64_t bytes = 0;
  for (size_t i = 0; i < m["files"].size(); ++i) {
    const int64_t size = check_file(check, m["files"][i], i, dir);
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

std::string seal_manifest(nlohmann::json manifest) {
  manifest[kSealField] = "00000000";
  std::string text = manifest.dump(2) + "\n";
  const size_t at = seal_digits_at(text);
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08x", crc32_of(text));
  text.replace(at, 8, hex);
  return text;
}

void check_manifest_seal(const std::string& text, const std::string& mpath) {
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

}  // namespace ringzero::checkpoint_format
