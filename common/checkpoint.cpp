#include "checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "check.hpp"
#include "comm.hpp"
#include "safetensors.hpp"

namespace fs = std::filesystem;

namespace ringzero {

namespace {

constexpr const char* kManifest = "manifest.json";
constexpr const char* kReplicatedFile = "model.safetensors";

std::string step_dir_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(step));
  return name;
}

// step_SSSSSSSS -> SSSSSSSS, or -1 for any other name. 8 digits or more: step_dir_name pads to
// 8 and writes step 100000000 on with 9 (up to 18: int64_t).
int64_t step_of_dir_name(const std::string& name) {
  if (name.size() < 13 || name.size() > 23 || name.rfind("step_", 0) != 0) return -1;
  int64_t s = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    s = s * 10 + (name[i] - '0');
  }
  return s;
}

uint32_t crc32_of(const std::string& bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  size_t done = 0;
  while (done < bytes.size()) {  // zlib takes uInt lengths
    const auto n = static_cast<uInt>(std::min<size_t>(bytes.size() - done, 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(bytes.data() + done), n);
    done += n;
  }
  return static_cast<uint32_t>(crc);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  RZ_CHECK(in, "cannot read " << path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The optimizer's state as named flat spans, parallel to the piece's params.
std::map<std::string, std::span<float>> optimizer_fields(Optimizer* optimizer) {
  std::map<std::string, std::span<float>> out;
  if (optimizer == nullptr) return out;
  if (AdamW* a = optimizer->adamw()) {
    out["exp_avg"] = a->exp_avg();
    out["exp_avg_sq"] = a->exp_avg_sq();
  } else if (SGD* s = optimizer->sgd(); s && !s->momentum_buffer().empty()) {
    out["momentum_buffer"] = s->momentum_buffer();
  }
  return out;
}

std::vector<std::string> field_names(const TrainConfig& c) {
  if (c.optimizer == "adamw") return {"params", "exp_avg", "exp_avg_sq"};
  if (c.momentum > 0) return {"params", "momentum_buffer"};
  return {"params"};
}

// "<name>.exp_avg" etc. in the replicated file and the consolidated optimizer state.
std::string tensor_key(const std::string& name, const std::string& field) {
  return field == "params" ? name : name + "." + field;
}

// Writes bytes to path.tmp, fsyncs, renames; with kill_halfway, the process kills itself
// (SIGKILL) after half the bytes: the fault test's crash in the middle of a write.
void write_atomically(const std::string& path, const std::string& bytes, bool kill_halfway) {
  const std::string tmp = path + ".tmp";
  // Past a file-size limit (ulimit -f) the kernel would kill the process with SIGXFSZ; ignored,
  // write() fails with EFBIG instead and the error below names the file, like ENOSPC.
  std::signal(SIGXFSZ, SIG_IGN);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  RZ_CHECK(fd >= 0, "cannot create " << tmp << ": " << std::strerror(errno)
                                     << "; check --checkpoint-dir exists and is writable");
  size_t done = 0;
  int error = 0;
  while (done < bytes.size()) {
    if (kill_halfway && done >= bytes.size() / 2) std::raise(SIGKILL);
    const size_t chunk = std::min<size_t>(bytes.size() - done, kill_halfway ? 4096 : 1 << 24);
    const ssize_t n = ::write(fd, bytes.data() + done, chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error = n < 0 ? errno : ENOSPC;
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (error == 0 && ::fsync(fd) != 0) error = errno;
  if (::close(fd) != 0 && error == 0) error = errno;
  if (error != 0) {
    ::unlink(tmp.c_str());
    RZ_CHECK(false, "writing " << path << " failed after " << done << " of " << bytes.size()
                               << " bytes: " << std::strerror(error)
                               << " (disk full or file size limit?); the previous checkpoint "
                                  "is untouched. Free space or point --checkpoint-dir elsewhere");
  }
  RZ_CHECK(::rename(tmp.c_str(), path.c_str()) == 0,
           "cannot rename " << tmp << " to " << path << ": " << std::strerror(errno));
  const std::string dir = fs::path(path).parent_path().string();
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {  // the rename itself must reach the disk before the manifest's does
    ::fsync(dfd);
    ::close(dfd);
  }
}

// The test hook RINGZERO_TEST_KILL_IN_CHECKPOINT=STEP:RANK.
bool kill_hook(int64_t step, int rank) {
  const char* env = std::getenv("RINGZERO_TEST_KILL_IN_CHECKPOINT");
  if (env == nullptr) return false;
  long long s = -1;
  int r = -1;
  return std::sscanf(env, "%lld:%d", &s, &r) == 2 && s == step && r == rank;
}

std::string json_str(const nlohmann::json& j) {
  return j.is_string() ? j.get<std::string>() : j.dump();
}

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
    integer(t, "offset", where, 0);
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
    // The larger of the recorded and the real size: a truncated file or a wrong
    // files[i].bytes is reported later, by name.
    std::error_code ec;
    const auto real = fs::file_size(dir / r["file"].get<std::string>(), ec);
    bytes += ec ? b : std::max(b, static_cast<int64_t>(real));
  }
  // Every field of every element is stored as 4 bytes in one of the files.
  const auto nfields = static_cast<int64_t>(m["fields"].size());
  RZ_CHECK(nfields == 0 || psi <= bytes / 4 / nfields,
           mpath << ": field num_parameters is " << psi << ", but the files hold " << bytes
                 << " bytes, too few for " << nfields
                 << " float32 fields of that many elements; the manifest is damaged. Resume "
                    "from another checkpoint");
}

}  // namespace

void atomic_write_file(const std::string& path, const std::string& bytes) {
  write_atomically(path, bytes, false);
}

nlohmann::json checkpoint_flags_that_must_match(const TrainConfig& c) {
  return {{"model", c.model},
          {"layer_sizes", c.layer_sizes()},
          {"data", c.dataset()},
          {"optimizer", c.optimizer},
          {"momentum", c.optimizer == "sgd" ? c.momentum : 0.0f},
          {"seed", c.seed},
          {"shuffle", !c.no_shuffle},
          {"global_batch_size", c.global_batch_size},
          {"precision", "fp32"}};
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
  // A FIFO or device would block or never end the read below.
  RZ_CHECK(fs::is_regular_file(mpath), mpath << ": not a regular file; a checkpoint's manifest "
                                                "is one. Resume from a real checkpoint");
  try {
    ck.manifest = nlohmann::json::parse(read_file(mpath));
  } catch (const nlohmann::json::exception& e) {
    RZ_CHECK(false, mpath << ": not valid JSON (" << e.what() << ")");
  }
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
  check_manifest_fields(m, mpath);
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

Checkpointer::Checkpointer(const TrainConfig& c, Communicator* comm) : config_(c), comm_(comm) {
  if (comm) rank_ = comm->rank(), world_size_ = comm->world_size();
  RZ_CHECK(c.checkpoint_every >= 0,
           "--checkpoint-every " << c.checkpoint_every << " must be >= 0 (0: no checkpoints)");
  RZ_CHECK(c.keep_checkpoints >= 0,
           "--keep-checkpoints " << c.keep_checkpoints << " must be >= 0 (0: keep all)");
  RZ_CHECK(c.checkpoint_every == 0 || !c.checkpoint_dir.empty(),
           "--checkpoint-every " << c.checkpoint_every
                                 << " needs --checkpoint-dir D (where to write them)");
  RZ_CHECK(c.resume.empty() || c.init_from.empty(),
           "--resume " << c.resume << " and --init-from " << c.init_from
                       << " both set the parameters; give one of them");
}

namespace {

// The training set's fingerprint (Dataset::crc32 and size, as verify_same_data compares across
// ranks), recorded in the manifest's field "data": another data set of the same shape (other
// files in --data-dir, relabelled samples) is refused at resume, naming both. A manifest
// without the field (written before it existed) is not checked.
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

}  // namespace

void Checkpointer::check_checkpoint_dir() {
  if (config_.checkpoint_dir.empty() || rank_ != 0) return;
  const fs::path d = config_.checkpoint_dir;
  // Writable, now: not after the last step (F2's lost run). Created if missing.
  std::error_code ec;
  fs::create_directories(d, ec);
  RZ_CHECK(!ec && fs::is_directory(d),
           "--checkpoint-dir " << config_.checkpoint_dir << ": cannot create the directory ("
                               << (ec ? ec.message() : "a file of that name exists")
                               << "); give a directory in a writable place");
  const std::string probe = (d / (".write-test." + std::to_string(::getpid()))).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  RZ_CHECK(fd >= 0, "--checkpoint-dir " << config_.checkpoint_dir << " is not writable ("
                                        << std::strerror(errno) << "); give a writable directory");
  ::close(fd);
  ::unlink(probe.c_str());
  // Another run's checkpoints: a run that did not resume from this directory must not save
  // into it, since its saves would prune them (docs/checkpoints.md, "One directory, one run").
  std::error_code same_ec;
  fs::path from = fs::path(resumed_dir_).lexically_normal();
  if (from.filename().empty()) from = from.parent_path();  // "D/step_X/"
  const bool resumed_here = !resumed_dir_.empty() && fs::equivalent(from.parent_path(), d, same_ec);
  if (resumed_here) return;
  int64_t newest = -1;
  for (const auto& e : fs::directory_iterator(d)) {
    const int64_t s = step_of_dir_name(e.path().filename().string());
    if (s >= 0 && e.is_directory() && fs::exists(e.path() / kManifest))
      newest = std::max(newest, s);
  }
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

TrainPosition Checkpointer::resume(TrainingState& state, int64_t steps_per_epoch) {
  if (config_.resume.empty()) return {};
  const std::string dir = resolve_checkpoint(config_.resume);
  CheckpointData ck = read_checkpoint(dir);
  const nlohmann::json& m = ck.manifest;
  const std::string mpath = (fs::path(dir) / kManifest).string();
  // The flags that give the state its meaning: refused when they differ.
  const nlohmann::json now = checkpoint_flags_that_must_match(config_);
  static const std::vector<std::pair<std::string, std::string>> flag_of = {
      {"model", "--model"},        {"layer_sizes", "--model/--hidden-sizes"},
      {"data", "--data"},          {"optimizer", "--optimizer"},
      {"momentum", "--momentum"},  {"seed", "--seed"},
      {"shuffle", "--no-shuffle"}, {"global_batch_size", "--global-batch-size"},
      {"precision", "precision"}};
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
  const Model& model = *state.model;
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
  // Load: every piece's parameters and optimizer state from the global layout.
  for (StatePiece& piece : state.pieces) {
    if (piece.params.empty()) continue;  // a shard of padding only
    const auto g = static_cast<size_t>(piece.global_offset);
    const auto& p = ck.fields.at("params");
    std::copy_n(p.begin() + g, piece.params.size(), piece.params.begin());
    for (auto& [field, span] : optimizer_fields(piece.optimizer)) {
      const auto& v = ck.fields.at(field);
      std::copy_n(v.begin() + g, span.size(), span.begin());
    }
    if (piece.optimizer == nullptr) continue;
    if (AdamW* a = piece.optimizer->adamw()) {
      auto& steps = a->segment_steps();
      for (size_t k = 0; k < steps.size(); ++k)
        steps[k] = tensors[piece.segment_params[k]].at("step").get<int64_t>();
    } else if (SGD* s = piece.optimizer->sgd()) {
      s->set_started(m.at("optimizer_state").at("started").get<bool>());
    }
  }
  if (state.params_replicated)
    for (size_t i = 0; i < params.size(); ++i)
      std::copy_n(ck.fields.at("params").begin() + model.offsets()[i], params[i]->numel(),
                  params[i]->data.data());
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
  if (writer) {
    std::map<std::string, NamedTensor> tensors;
    nlohmann::json runs = nlohmann::json::array();
    if (!state.sharded) {
      std::map<std::string, std::span<float>> spans =
          optimizer_fields(state.pieces.at(0).optimizer);
      spans["params"] = state.pieces.at(0).params;
      for (size_t i = 0; i < params.size(); ++i) {
        const auto off = static_cast<size_t>(model.offsets()[i]);
        for (const auto& f : fields) {
          RZ_CHECK(spans.count(f), "checkpoint: rank 0 holds no " << f << " to save");
          const std::span<float> v = spans[f].subspan(off, params[i]->numel());
          tensors[tensor_key(params[i]->name(), f)] = {params[i]->shape(), {v.begin(), v.end()}};
        }
      }
    } else {
      for (const auto& f : fields) tensors[f].shape = {0};
      int64_t local = 0;
      for (const StatePiece& piece : state.pieces) {
        std::map<std::string, std::span<float>> spans = optimizer_fields(piece.optimizer);
        spans["params"] = piece.params;
        for (const auto& f : fields) {
          // An empty shard (a bucket or layer with fewer elements than ranks) has no SGD
          // momentum buffer; it contributes nothing to any field.
          if (!spans.count(f) && piece.params.empty()) continue;
          RZ_CHECK(spans.count(f), "checkpoint: rank " << rank_ << "'s shard at global offset "
                                                       << piece.global_offset << " holds no " << f
                                                       << " to save");
          tensors[f].values.insert(tensors[f].values.end(), spans[f].begin(), spans[f].end());
        }
        if (!piece.params.empty())
          runs.push_back({piece.global_offset, local, static_cast<int64_t>(piece.params.size())});
        local += static_cast<int64_t>(piece.params.size());
      }
      for (const auto& f : fields) tensors[f].shape = {local};
    }
    for (const StatePiece& piece : state.pieces)
      if (piece.optimizer && piece.optimizer->adamw())
        for (size_t k = 0; k < piece.segment_params.size(); ++k) {
          const auto t = static_cast<double>(piece.optimizer->adamw()->segment_steps()[k]);
          double* st = &steps[3 * piece.segment_params[k]];
          st[0] += t, st[1] += t * t, st[2] += 1;
        }
    char name[48];
    std::snprintf(name, sizeof name, "shard_%05d.safetensors", rank_);
    const std::string file = state.sharded ? name : kReplicatedFile;
    const std::string bytes = safetensors_bytes(tensors);
    write_atomically((dir / file).string(), bytes, kill_hook(pos.step, rank_));
    record = {{"file", file},
              {"rank", rank_},
              {"kind", state.sharded ? "flat" : "state_dict"},
              {"bytes", bytes.size()},
              {"crc32", crc32_of(bytes)}};
    if (state.sharded) record["runs"] = runs;
  }
  if (comm_) comm_->all_reduce_metrics(steps);
  std::vector<std::string> records{record.dump()};
  if (comm_) records = comm_->gather_strings(record.dump(), 0);
  if (rank_ == 0) {
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
    m["tensors"] = nlohmann::json::array();
    for (size_t i = 0; i < params.size(); ++i) {
      nlohmann::json t = {{"name", params[i]->name()},
                          {"shape", params[i]->shape()},
                          {"offset", model.offsets()[i]},
                          {"numel", params[i]->numel()}};
      const double* st = &steps[3 * i];
      if (config_.optimizer == "adamw") {
        RZ_CHECK(st[2] > 0 && st[1] * st[2] == st[0] * st[0],
                 "checkpoint: the pieces of " << params[i]->name()
                                              << " took different numbers of steps");
        t["step"] = static_cast<int64_t>(st[0] / st[2]);
      }
      m["tensors"].push_back(t);
    }
    m["files"] = nlohmann::json::array();
    for (const auto& r : records)
      if (r != "null") m["files"].push_back(nlohmann::json::parse(r));
    write_atomically((dir / kManifest).string(), m.dump(2) + "\n", false);  // the commit
    print0("checkpoint " + dir.string() + " committed (step " + std::to_string(pos.step) + ")");
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
    while (!committed.empty() && committed.front().first > pos.step) {
      fs::remove_all(committed.front().second);
      committed.erase(committed.begin());
    }
    if (config_.keep_checkpoints > 0)
      for (size_t i = static_cast<size_t>(config_.keep_checkpoints); i < committed.size(); ++i)
        fs::remove_all(committed[i].second);
    for (const auto& [s, p] : interrupted)
      if (s != pos.step) fs::remove_all(p);
  }
  last_saved_ = pos.step;
  if (comm_) comm_->barrier();
}

}  // namespace ringzero
