// Safetensors: a round trip (bit-exact), the on-disk layout other tools read, state_dict /
// load_state_dict, and the errors: missing, truncated, bad dtype, bad header, bad offsets.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/io/safetensors.hpp"
#include "util.hpp"

using namespace ringzero;
using namespace ringzero::test;
using Catch::Matchers::Contains;

namespace {

void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A file with one tensor whose header is `header` (a JSON object) and `data_bytes` of data.
std::string handmade(const nlohmann::json& header, size_t data_bytes) {
  const std::string h = header.dump();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(h.size() >> (8 * i));
  return out + h + std::string(data_bytes, '\0');
}

}  // namespace

TEST_CASE("safetensors round trip is bit-exact and has the reference layout", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  std::map<std::string, NamedTensor> tensors;
  tensors["b"] = {{3}, {1.5f, -0.0f, std::numeric_limits<float>::denorm_min()}};
  tensors["a.weight"] = {{2, 2}, {1e-30f, -3.25f, 7.0f, std::numeric_limits<float>::infinity()}};
  tensors["empty"] = {{0, 4}, {}};
  save_safetensors(path, tensors);
  auto back = load_safetensors(path);
  REQUIRE(back.size() == 3);
  for (const auto& [name, t] : tensors) {
    REQUIRE(back.at(name).shape == t.shape);
    REQUIRE(back.at(name).values.size() == t.values.size());
    if (!t.values.empty())  // memcmp must not see the null data() of an empty vector
      REQUIRE(std::memcmp(back.at(name).values.data(), t.values.data(), t.values.size() * 4) == 0);
  }

  // Layout (huggingface/safetensors): u64 LE header size, JSON header, data 8-byte aligned,
  // tensors sorted by name, offsets relative to the data section.
  const std::string bytes = read_all(path);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  REQUIRE((8 + n) % 8 == 0);
  const auto header = nlohmann::json::parse(bytes.substr(8, n));
  REQUIRE(header.at("a.weight").at("dtype") == "F32");
  REQUIRE(header.at("a.weight").at("shape") == nlohmann::json::array({2, 2}));
  REQUIRE(header.at("a.weight").at("data_offsets") == nlohmann::json::array({0, 16}));
  REQUIRE(header.at("b").at("data_offsets") == nlohmann::json::array({16, 28}));
  REQUIRE(bytes.size() == 8 + n + 28);
  float first;
  std::memcpy(&first, bytes.data() + 8 + n, 4);
  REQUIRE(first == 1e-30f);
}

TEST_CASE("state_dict and load_state_dict move a model's parameters", "[safetensors]") {
  TempDir dir;
  Model a({5, 4, 3}, 1), b({5, 4, 3}, 2);
  save_safetensors(dir.file("a.safetensors"), state_dict(a));
  load_state_dict(b, load_safetensors(dir.file("a.safetensors")), "a.safetensors");
  REQUIRE(std::equal(a.params_memory.span().begin(), a.params_memory.span().end(),
                     b.params_memory.span().begin()));
  auto sd = state_dict(a);
  REQUIRE(sd.size() == 4);
  REQUIRE(sd.at("0.weight").shape == Shape{4, 5});  // (out, in), as PyTorch's state_dict
  REQUIRE(sd.at("2.bias").shape == Shape{3});

  Model other({5, 6, 3}, 1);
  REQUIRE_THROWS_WITH(load_state_dict(other, sd, "a.safetensors"),
                      Contains("0.weight has shape (4, 5), the model expects (6, 5)"));
  auto missing = sd;
  missing.erase("2.bias");
  REQUIRE_THROWS_WITH(load_state_dict(b, missing, "x"), Contains("x has no tensor 2.bias"));
  auto extra = sd;
  extra["4.weight"] = {{1}, {0.0f}};
  REQUIRE_THROWS_WITH(load_state_dict(b, extra, "x"), Contains("x has 5 tensors, the model 4"));
}

TEST_CASE("load_safetensors names the file and the problem", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  SECTION("missing") {
    REQUIRE_THROWS_WITH(load_safetensors(dir.file("none.safetensors")),
                        Contains("none.safetensors: no such file"));
  }
  SECTION("shorter than the header length") {
    write_all(path, "abc");
    REQUIRE_THROWS_WITH(load_safetensors(path), Contains(path) && Contains("3 bytes"));
  }
  SECTION("truncated header") {
    std::map<std::string, NamedTensor> t{{"x", {{2}, {1, 2}}}};
    save_safetensors(path, t);
    write_all(path, read_all(path).substr(0, 20));
    REQUIRE_THROWS_WITH(load_safetensors(path),
                        Contains(path) && Contains("exceeds the file (20 bytes)"));
  }
  SECTION("truncated data") {
    std::map<std::string, NamedTensor> t{{"x", {{4}, {1, 2, 3, 4}}}};
    save_safetensors(path, t);
    const std::string bytes = read_all(path);
    write_all(path, bytes.substr(0, bytes.size() - 4));
    REQUIRE_THROWS_WITH(load_safetensors(path),
                        Contains(path) && Contains("out of range of the 12 data bytes"));
  }
  SECTION("dtype other than F32") {
    write_all(path,
              handmade({{"x", {{"dtype", "F16"}, {"shape", {2}}, {"data_offsets", {0, 4}}}}}, 4));
    REQUIRE_THROWS_WITH(load_safetensors(path),
                        Contains(path) && Contains("tensor x has dtype F16"));
  }
  SECTION("offsets that do not match the shape") {
    write_all(path,
              handmade({{"x", {{"dtype", "F32"}, {"shape", {3}}, {"data_offsets", {0, 8}}}}}, 8));
    REQUIRE_THROWS_WITH(load_safetensors(path), Contains("holds 8 bytes, shape (3) needs 12"));
  }
  SECTION("header not JSON") {
    std::string bytes(8, '\0');
    bytes[0] = 5;
    write_all(path, bytes + "{oops");
    REQUIRE_THROWS_WITH(load_safetensors(path), Contains(path) && Contains("not valid JSON"));
  }
  SECTION("unwritable path") {
    REQUIRE_THROWS_WITH(save_safetensors(dir.file("no/such/dir.safetensors"), {}),
                        Contains("cannot write"));
  }
}
