// common/io/checkpoint without MPI: a replicated checkpoint round-trips the model and AdamW/SGD
// state exactly (bitwise: only copies); --resume D takes the newest committed step and skips a
// directory without a manifest; consolidation names and values; refusals name file and field
// (a changed flag, an unknown format_version, a file whose size differs, two files covering
// one element). The distributed cases (shards, resharding, faults) are in
// tests/chapters/ckpt_*.sh.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>

#include "common/io/checkpoint.hpp"
#include "common/io/checkpoint_format.hpp"
#include "common/io/safetensors.hpp"

using namespace ringzero;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) {
  const fs::path d =
      fs::temp_directory_path() / ("ringzero_ckpt_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

TrainConfig toy_config(const fs::path& dir) {
  TrainConfig c;
  c.model = "toy";
  c.hidden_sizes = {5, 3};
  c.global_batch_size = 8;
  c.checkpoint_dir = dir.string();
  return c;
}

// Two optimizer steps with made-up gradients, so the moments and step counts are non-trivial.
void train_two_steps(Model& model, Optimizer& opt) {
  for (int s = 0; s < 2; ++s) {
    auto g = model.grads_memory.span();
    for (size_t i = 0; i < g.size(); ++i)
      g[i] = 0.01f * static_cast<float>((i * 7 + s) % 13) - 0.05f;
    opt.step(model.params_memory.span(), model.grads_memory.span());
  }
}

// Edits a manifest as another tool would, then re-seals it (its manifest_crc32 recomputed), so
// that the check behind the seal is the one tested; sealed = false leaves the old seal.
void edit_manifest(const fs::path& step_dir, const std::function<void(nlohmann::json&)>& edit,
                   bool sealed = true) {
  nlohmann::json m = nlohmann::json::parse(std::ifstream(step_dir / "manifest.json"));
  edit(m);
  std::ofstream(step_dir / "manifest.json")
      << (sealed ? checkpoint_format::seal_manifest(m) : m.dump(2) + "\n");
}

}  // namespace

TEST_CASE("checkpoint: replicated round trip, AdamW, bitwise", "[checkpoint]") {
  const fs::path dir = fresh_dir("adamw");
  TrainConfig c = toy_config(dir);
  Model model(c.layer_sizes(), 1);
  Optimizer opt(c, parameter_sizes(model));
  train_two_steps(model, opt);
  TrainingState state = replicated_state(model, &opt, "unit");
  Checkpointer ck(c, nullptr);
  ck.save(state, {2, 1, 2}, 125);
  REQUIRE(fs::exists(dir / "step_00000002" / "manifest.json"));
  REQUIRE(fs::exists(dir / "step_00000002" / "model.safetensors"));

  // A new model (another seed) and optimizer, resumed.
  TrainConfig r = c;
  r.resume = dir.string();
  Model model2(c.layer_sizes(), 99);
  Optimizer opt2(r, parameter_sizes(model2));
  TrainingState state2 = replicated_state(model2, &opt2, "unit");
  Checkpointer ck2(r, nullptr);
  const TrainPosition pos = ck2.resume(state2, 125);
  CHECK(pos.step == 2);
  CHECK(pos.epoch == 1);
  CHECK(pos.t == 2);
  auto same = [](std::span<const float> a, std::span<const float> b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
  };
  CHECK(same(model.params_memory.span(), model2.params_memory.span()));
  CHECK(same(opt.adamw()->exp_avg(), opt2.adamw()->exp_avg()));
  CHECK(same(opt.adamw()->exp_avg_sq(), opt2.adamw()->exp_avg_sq()));
  CHECK(opt2.adamw()->segment_steps() == std::vector<int64_t>(6, 2));

  // Consolidation: PyTorch names, the optimizer's under <name>.exp_avg etc. and .step.
  const CheckpointData data = read_checkpoint(resolve_checkpoint(dir.string()));
  auto sd = consolidated_state_dict(data, true);
  CHECK(sd.size() == 6 * 4);
  REQUIRE(sd.count("2.weight"));
  CHECK(sd["2.weight"].shape == Shape{3, 5});
  CHECK(sd["0.bias.step"].values == std::vector<float>{2.0f});
  const Parameter* w = model.parameters()[2];
  CHECK(std::memcmp(sd["2.weight"].values.data(), w->data.data(), 15 * 4) == 0);
  fs::remove_all(dir);
}

TEST_CASE("checkpoint: SGD momentum buffer and first-step flag", "[checkpoint]") {
  const fs::path dir = fresh_dir("sgd");
  TrainConfig c = toy_config(dir);
  c.optimizer = "sgd";
  c.momentum = 0.9f;
  Model model(c.layer_sizes(), 1);
  Optimizer opt(c, parameter_sizes(model));
  train_two_steps(model, opt);
  TrainingState state = replicated_state(model, &opt, "unit");
  Checkpointer(c, nullptr).save(state, {2, 1, 2}, 125);
  TrainConfig r = c;
  r.resume = (dir / "step_00000002").string();
  Model model2(c.layer_sizes(), 5);
  Optimizer opt2(r, parameter_sizes(model2));
  TrainingState state2 = replicated_state(model2, &opt2, "unit");
  Checkpointer(r, nullptr).resume(state2, 125);
  CHECK(opt2.sgd()->started());
  CHECK(std::memcmp(opt.sgd()->momentum_buffer().data(), opt2.sgd()->momentum_buffer().data(),
                    opt.sgd()->momentum_buffer().size() * 4) == 0);
  fs::remove_all(dir);
}

TEST_CASE("checkpoint: newest committed, pruning, refusals", "[checkpoint]") {
  const fs::path dir = fresh_dir("refuse");
  TrainConfig c = toy_config(dir);
  c.keep_checkpoints = 2;
  Model model(c.layer_sizes(), 1);
  Optimizer opt(c, parameter_sizes(model));
  TrainingState state = replicated_state(model, &opt, "unit");
  Checkpointer ck(c, nullptr);
  for (int64_t s : {1, 2, 3}) {
    train_two_steps(model, opt);
    ck.save(state, {s, 1, s}, 125);
  }
  CHECK_FALSE(fs::exists(dir / "step_00000001"));  // --keep-checkpoints 2
  fs::create_directories(dir / "step_00000009");   // an interrupted write: no manifest
  CHECK(resolve_checkpoint(dir.string()) == (dir / "step_00000003").string());

  TrainConfig r = c;
  r.resume = dir.string();
  Model model2(c.layer_sizes(), 1);
  Optimizer opt2(r, parameter_sizes(model2));
  TrainingState state2 = replicated_state(model2, &opt2, "unit");
  SECTION("changed flag") {
    r.global_batch_size = 16;
    CHECK_THROWS_WITH(Checkpointer(r, nullptr).resume(state2, 62),
                      Contains("manifest.json: field flags.global_batch_size is 8") &&
                          Contains("--global-batch-size 16"));
  }
  SECTION("unknown version") {
    edit_manifest(dir / "step_00000003", [](nlohmann::json& m) { m["format_version"] = 1; });
    CHECK_THROWS_WITH(Checkpointer(r, nullptr).resume(state2, 125),
                      Contains("step_00000003/manifest.json: field format_version is 1") &&
                          Contains("reads version 2 only"));
  }
  SECTION("size differs") {
    edit_manifest(dir / "step_00000003", [](nlohmann::json& m) { m["files"][0]["bytes"] = 12; });
    CHECK_THROWS_WITH(read_checkpoint((dir / "step_00000003").string()),
                      Contains("model.safetensors: ") && Contains(".bytes says 12"));
  }
  SECTION("an element in two files") {
    edit_manifest(dir / "step_00000003",
                  [](nlohmann::json& m) { m["files"].push_back(m["files"][0]); });
    CHECK_THROWS_WITH(read_checkpoint((dir / "step_00000003").string()),
                      Contains("element 0 of the model is held by 2 files"));
  }
  SECTION("an edit without a new seal: the optimizer's step count") {
    edit_manifest(
        dir / "step_00000003", [](nlohmann::json& m) { m["tensors"][0]["step"] = 1; }, false);
    CHECK_THROWS_WITH(read_checkpoint((dir / "step_00000003").string()),
                      Contains("step_00000003/manifest.json: field manifest_crc32 is ") &&
                          Contains("edited or corrupted after it was written"));
  }
  SECTION("no seal at all") {
    edit_manifest(
        dir / "step_00000003", [](nlohmann::json& m) { m.erase("manifest_crc32"); }, false);
    CHECK_THROWS_WITH(read_checkpoint((dir / "step_00000003").string()),
                      Contains("field manifest_crc32 (8 hex digits") && Contains("missing"));
  }
  SECTION("a run beyond the model is refused before a byte is copied") {
    // Resharded as one flat file: its runs name global offsets past the model's end.
    edit_manifest(dir / "step_00000003", [](nlohmann::json& m) {
      m["files"][0]["kind"] = "flat";
      m["files"][0]["runs"] = {{m["num_parameters"].get<int64_t>() + 1000, 0, 8}};
    });
    CHECK_THROWS_WITH(read_checkpoint((dir / "step_00000003").string()),
                      Contains("outside the model's") && Contains("manifest.json is damaged"));
  }
  SECTION("a file name that leaves the directory") {
    edit_manifest(dir / "step_00000003",
                  [](nlohmann::json& m) { m["files"][0]["file"] = "../step_00000002/x"; });
    CHECK_THROWS_WITH(read_checkpoint((dir / "step_00000003").string()),
                      Contains("field files[0].file is missing or not a file name inside"));
  }
  SECTION("a key given twice") {
    std::string text;
    {
      std::ifstream in(dir / "step_00000003" / "manifest.json");
      text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    text.insert(text.find('{') + 1, "\n  \"global_step\": 1,");
    CHECK_THROWS_WITH(read_checkpoint_manifest(text, (dir / "step_00000003").string()),
                      Contains("manifest.json: the JSON names \"global_step\" twice"));
  }
  SECTION("NaN parameters: saved after a divergence, named as such") {
    const fs::path file = dir / "step_00000003" / "model.safetensors";
    auto tensors = load_safetensors(file.string());
    tensors.begin()->second.values[1] = std::nanf("");
    const std::string bytes = safetensors_bytes(tensors);
    std::ofstream(file, std::ios::binary) << bytes;
    edit_manifest(dir / "step_00000003", [&](nlohmann::json& m) {
      m["files"][0]["bytes"] = bytes.size();
      m["files"][0]["crc32"] = checkpoint_format::crc32_of(bytes);
    });
    CHECK_THROWS_WITH(Checkpointer(r, nullptr).resume(state2, 125),
                      Contains("hold nan at ") && Contains("had diverged"));
  }
  fs::remove_all(dir);
}

TEST_CASE("checkpoint: the manifest's seal round-trips and names both CRCs", "[checkpoint][harden]") {
  const nlohmann::json m = {{"format", "ringzero-checkpoint"}, {"global_step", 7}};
  const std::string text = checkpoint_format::seal_manifest(m);
  REQUIRE(nlohmann::json::parse(text)["manifest_crc32"].get<std::string>().size() == 8);
  checkpoint_format::check_manifest_seal(text, "m.json");  // accepted as written
  std::string edited = text;
  edited.replace(edited.find("7"), 1, "8");
  REQUIRE_THROWS_WITH(checkpoint_format::check_manifest_seal(edited, "m.json"),
                      Contains("m.json: field manifest_crc32 is ") &&
                          Contains("but the manifest's text has CRC-32"));
  // Twice: which one is meant is undefined.
  std::string twice = text;
  twice.insert(1, "\"manifest_crc32\": \"00000000\",");
  REQUIRE_THROWS_WITH(checkpoint_format::check_manifest_seal(twice, "m.json"),
                      Contains("missing, malformed or given twice"));
}
