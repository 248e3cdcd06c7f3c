// libFuzzer target: the checkpoint reader (read_checkpoint_manifest) on an arbitrary manifest
// text, over a fixed checkpoint directory. Built with clang -fsanitize=fuzzer,address,undefined
// by tests/fuzz/build.sh; run by ctest (fuzz_manifest) for a bounded time from the seed corpus
// in tests/fuzz/corpus/manifest.
//
// The directory (made once, in a temporary folder) holds the files the corpus manifests list: a
// replicated checkpoint file (model.safetensors: tensors "w" [2, 3] and "b" [2] with their AdamW
// moments) and two ZeRO shards (shard_00000/1.safetensors: flat "params", "exp_avg",
// "exp_avg_sq" of 5 and 3 elements). Each input's manifest_crc32 is recomputed before the read
// (when the field is there), so the fuzzer reaches the field and range checks behind the seal;
// the seal itself is tested in tests/unit/checkpoint_test.cpp.
// A finding is a crash, a sanitizer report (a byte copied out of range), a leak or an
// exception that is not ringzero::Error: every damaged manifest must end in an Error naming it.
//
// FUZZ_MANIFEST_WRITE_SEEDS=DIR ./fuzz_manifest writes the seed corpus into DIR and exits (the
// committed seeds were made so: rerun only to change them).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <unistd.h>

#include "common/core/check.hpp"
#include "common/io/checkpoint.hpp"
#include "common/io/checkpoint_format.hpp"
#include "common/io/safetensors.hpp"

namespace fs = std::filesystem;
using namespace ringzero;
using namespace ringzero::checkpoint_format;

namespace {

std::string g_dir;  // the fixed checkpoint directory

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

nlohmann::json file_record(const std::string& name, const std::string& kind) {
  std::ifstream in(fs::path(g_dir) / name, std::ios::binary);
  const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  return {{"file", name}, {"rank", 0}, {"kind", kind},
          {"bytes", bytes.size()}, {"crc32", crc32_of(bytes)}};
}

// A manifest of the shape Checkpointer::save writes, for the files in g_dir.
nlohmann::json base_manifest(bool sharded) {
  nlohmann::json m = {{"format", "ringzero-checkpoint"},
                      {"format_version", kCheckpointFormatVersion},
                      {"num_parameters", 8},
                      {"world_size", sharded ? 2 : 1},
                      {"zero_stage", sharded ? 1 : 0},
                      {"global_step", 4},
                      {"epoch", 1},
                      {"position_in_epoch", 4},
                      {"steps_per_epoch", 10},
                      {"flags", {{"model", "toy"}, {"seed", 0}}},
                      {"optimizer_state", {{"type", "adamw"}}},
                      {"fields", {"params", "exp_avg", "exp_avg_sq"}},
                      {"tensors",
                       {{{"name", "w"}, {"shape", {2, 3}}, {"offset", 0}, {"numel", 6}, {"step", 4}},
                        {{"name", "b"}, {"shape", {2}}, {"offset", 6}, {"numel", 2}, {"step", 4}}}}};
  if (!sharded) {
    m["files"] = {file_record("model.safetensors", "state_dict")};
    return m;
  }
  nlohmann::json a = file_record("shard_00000.safetensors", "flat");
  a["runs"] = {{0, 0, 5}};
  nlohmann::json b = file_record("shard_00001.safetensors", "flat");
  b["rank"] = 1;
  b["runs"] = {{5, 0, 1}, {6, 1, 2}};
  m["files"] = {a, b};
  return m;
}

void make_directory() {
  g_dir = (fs::temp_directory_path() / ("fuzz_manifest." + std::to_string(::getpid()))).string();
  fs::create_directories(g_dir);
  auto values = [](int n, float base) {
    std::vector<float> v;
    for (int i = 0; i < n; ++i) v.push_back(base + static_cast<float>(i));
    return v;
  };
  std::map<std::string, NamedTensor> full;
  for (const char* f : {"", ".exp_avg", ".exp_avg_sq"}) {
    full[std::string("w") + f] = {{2, 3}, values(6, 1)};
    full[std::string("b") + f] = {{2}, values(2, 7)};
  }
  write_bytes(fs::path(g_dir) / "model.safetensors", safetensors_bytes(full));
  for (int r = 0; r < 2; ++r) {
    std::map<std::string, NamedTensor> shard;
    const int n = r == 0 ? 5 : 3;
    for (const char* f : {"params", "exp_avg", "exp_avg_sq"}) shard[f] = {{n}, values(n, r * 5)};
    char name[32];
    std::snprintf(name, sizeof name, "shard_%05d.safetensors", r);
    write_bytes(fs::path(g_dir) / name, safetensors_bytes(shard));
  }
}

void write_seeds(const std::string& out) {
  fs::create_directories(out);
  auto seed = [&](const std::string& name, const nlohmann::json& m) {
    write_bytes(fs::path(out) / name, seal_manifest(m));
  };
  seed("replicated", base_manifest(false));
  seed("sharded", base_manifest(true));
  nlohmann::json m = base_manifest(true);
  m["files"][1]["runs"] = {{5, 0, 1}, {600, 1, 2}};  // a run beyond the model
  seed("run_beyond_model", m);
  m = base_manifest(true);
  m["files"][0]["runs"] = {{0, 0, 4}};  // element 4 held by no file
  seed("hole", m);
  m = base_manifest(false);
  m["tensors"][1]["offset"] = 5;  // overlapping tensors
  seed("overlap", m);
  m = base_manifest(false);
  m["num_parameters"] = 9000000000000LL;
  seed("huge_psi", m);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  make_directory();
  if (const char* out = std::getenv("FUZZ_MANIFEST_WRITE_SEEDS")) {
    write_seeds(out);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  try {
    // Re-seal what the fuzzer wrote: the field's 8 digits get the text's CRC-32.
    const std::string key = std::string("\"") + kSealField + "\": \"";
    if (const size_t k = text.find(key); k != std::string::npos && k + key.size() + 8 <= size) {
      text.replace(k + key.size(), 8, "00000000");
      char hex[9];
      std::snprintf(hex, sizeof hex, "%08x", crc32_of(text));
      text.replace(k + key.size(), 8, hex);
    }
    const CheckpointData ck = read_checkpoint_manifest(text, g_dir);
    // A manifest that reads must give every field exactly num_parameters values.
    const int64_t psi = ck.manifest.at("num_parameters").get<int64_t>();
    for (const auto& [name, values] : ck.fields)
      if (static_cast<int64_t>(values.size()) != psi) __builtin_trap();
  } catch (const ringzero::Error&) {
    // the expected outcome for a damaged manifest
  }
  return 0;
}
