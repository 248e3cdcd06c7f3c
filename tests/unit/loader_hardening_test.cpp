// The loaders trust nothing (issue 9, items 5 and 6): every rule of the safetensors format and
// of the IDX .gz files is enforced, each error names the file and (for safetensors) the tensor,
// sizes never overflow and a header that lies about sizes allocates nothing; non-finite initial
// weights are refused naming tensor and index. The expected messages are written out here.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <zlib.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/core/nn.hpp"
#include "common/data/data.hpp"
#include "common/io/safetensors.hpp"

using namespace ringzero;
using Catch::Matchers::Contains;

namespace {

// A safetensors image: u64 LE header length, the header text, `data_bytes` zero bytes.
std::vector<uint8_t> st_image(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> out;
  out.reserve(8 + header.size() + data_bytes);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(header.size() >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  out.resize(out.size() + data_bytes, 0);
  return out;
}
std::vector<uint8_t> st_image(const nlohmann::json& header, size_t data_bytes) {
  return st_image(header.dump(), data_bytes);
}
nlohmann::json f32(nlohmann::json shape, int64_t begin, int64_t end) {
  return {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {begin, end}}};
}

// gzip (not zlib) compression of `bytes`, one member, via deflateInit2 with windowBits 16+15.
std::vector<uint8_t> gzip(const std::vector<uint8_t>& bytes) {
  z_stream zs{};
  REQUIRE(deflateInit2(&zs, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) == Z_OK);
  std::vector<uint8_t> out(deflateBound(&zs, bytes.size()) + 64);
  zs.next_in = const_cast<Bytef*>(bytes.data());
  zs.avail_in = static_cast<uInt>(bytes.size());
  zs.next_out = out.data();
  zs.avail_out = static_cast<uInt>(out.size());
  REQUIRE(deflate(&zs, Z_FINISH) == Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}
std::vector<uint8_t> idx(const std::vector<uint32_t>& dims, size_t data_bytes) {
  std::vector<uint8_t> out{0, 0, 0x08, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims)
    for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(d >> s));
  for (size_t i = 0; i < data_bytes; ++i) out.push_back(static_cast<uint8_t>(i * 13));
  return out;
}

}  // namespace

TEST_CASE("parse_safetensors enforces the format's rules, naming file and tensor",
          "[safetensors][harden]") {
  const std::string f = "w.safetensors";
  auto parse = [&](const std::vector<uint8_t>& b) { return parse_safetensors(b, f); };

  SECTION("a valid two-tensor file parses") {
    auto t = parse(st_image({{"a", f32({2}, 0, 8)}, {"b", f32({1, 1}, 8, 12)}}, 12));
    REQUIRE(t.size() == 2);
    REQUIRE(t.at("b").shape == Shape{1, 1});
  }
  SECTION("header that is an array, not an object") {
    REQUIRE_THROWS_WITH(parse(st_image(std::string("[1,2]"), 0)),
                        Contains(f) && Contains("header is a JSON array"));
  }
  SECTION("tensor described by a string") {
    REQUIRE_THROWS_WITH(parse(st_image({{"w", "F32"}}, 0)),
                        Contains(f) && Contains("tensor w is described by a JSON string"));
  }
  SECTION("missing shape") {
    REQUIRE_THROWS_WITH(parse(st_image({{"w", {{"dtype", "F32"}, {"data_offsets", {0, 4}}}}}, 4)),
                        Contains(f) && Contains("tensor w has no \"shape\""));
  }
  SECTION("string offsets") {
    nlohmann::json h = {{"w", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {"0", "4"}}}}};
    REQUIRE_THROWS_WITH(parse(st_image(h, 4)),
                        Contains(f) && Contains("tensor w: data_offsets has \"0\", expected a "
                                                "non-negative integer"));
  }
  SECTION("dtype that is a number") {
    nlohmann::json h = {{"w", {{"dtype", 7}, {"shape", {1}}, {"data_offsets", {0, 4}}}}};
    REQUIRE_THROWS_WITH(parse(st_image(h, 4)), Contains("tensor w: dtype is a JSON number"));
  }
  SECTION("negative and fractional dimensions") {
    REQUIRE_THROWS_WITH(parse(st_image({{"w", f32({-1}, 0, 4)}}, 4)),
                        Contains(f) && Contains("tensor w: shape has -1"));
    REQUIRE_THROWS_WITH(parse(st_image({{"w", f32({1.5}, 0, 4)}}, 4)),
                        Contains("tensor w: shape has 1.5"));
  }
  SECTION("element and byte counts that overflow int64 (2^62 + 1; 2^32 x 2^32)") {
    REQUIRE_THROWS_WITH(parse(st_image({{"w", f32({(int64_t{1} << 62) + 1}, 0, 4)}}, 4)),
                        Contains(f) && Contains("tensor w byte count") &&
                            Contains("4611686018427387905 x 4 overflows int64"));
    REQUIRE_THROWS_WITH(
        parse(st_image({{"w", f32({int64_t{1} << 32, int64_t{1} << 32}, 0, 4)}}, 4)),
        Contains("tensor w element count") && Contains("overflows int64"));
    REQUIRE_THROWS_WITH(parse(st_image(std::string(R"({"w": {"dtype": "F32", "shape": [1], )"
                                                   R"("data_offsets": [0, 9223372036854775808]}})"),
                                       4)),
                        Contains("tensor w: data_offsets 9223372036854775808 exceeds 2^63 - 1"));
  }
  SECTION("overlapping data ranges") {
    REQUIRE_THROWS_WITH(parse(st_image({{"a", f32({2}, 0, 8)}, {"b", f32({2}, 4, 12)}}, 12)),
                        Contains(f) && Contains("tensor b data [4, 12) overlaps tensor a [0, 8)"));
  }
  SECTION("a hole between tensors, and trailing data") {
    REQUIRE_THROWS_WITH(parse(st_image({{"a", f32({1}, 0, 4)}, {"b", f32({1}, 8, 12)}}, 12)),
                        Contains("bytes [4, 8) of the data belong to no tensor (before tensor b)"));
    REQUIRE_THROWS_WITH(
        parse(st_image({{"a", f32({1}, 0, 4)}}, 8)),
        Contains("bytes [4, 8) of the data belong to no tensor") && Contains("trailing data"));
  }
  SECTION("__metadata__ must map strings to strings") {
    REQUIRE_THROWS_WITH(parse(st_image({{"__metadata__", {{"k", 1}}}}, 0)),
                        Contains(f) && Contains("__metadata__[\"k\"] is a JSON number"));
    REQUIRE_THROWS_WITH(parse(st_image({{"__metadata__", {1, 2}}}, 0)),
                        Contains("__metadata__ is a JSON array"));
  }
  SECTION("header length beyond the file, or beyond the format's 100 MB") {
    std::vector<uint8_t> b(16, 0);
    b[7] = 0x80;  // 2^63
    REQUIRE_THROWS_WITH(parse(b), Contains("header length 9223372036854775808 exceeds the file"));
  }
}

TEST_CASE("load_state_dict refuses non-finite initial weights, naming tensor and index",
          "[safetensors][harden]") {
  Model model({3, 2}, 0);
  auto sd = state_dict(model);
  sd.at("0.weight").values[4] = std::numeric_limits<float>::quiet_NaN();
  REQUIRE_THROWS_WITH(load_state_dict(model, sd, "init.safetensors"),
                      Contains("init.safetensors: tensor 0.weight holds nan at index 4 of 6") &&
                          Contains("initial weights must be finite"));
  sd = state_dict(model);
  sd.at("0.bias").values[1] = -std::numeric_limits<float>::infinity();
  REQUIRE_THROWS_WITH(load_state_dict(model, sd, "init.safetensors"),
                      Contains("tensor 0.bias holds -inf at index 1 of 2"));
}

TEST_CASE("decode_idx_gz: huge dimensions, damaged gzip, truncation; never allocates a claim",
          "[data][idx][harden]") {
  const std::string f = "x-idx3-ubyte.gz";
  SECTION("a good file, with the CRC-32 of its decoded bytes") {
    const auto plain = idx({2, 3, 4}, 24);
    IdxArray a = decode_idx_gz(gzip(plain), f, 3);
    REQUIRE(a.dims == std::vector<int64_t>{2, 3, 4});
    REQUIRE(a.decoded_bytes == 16 + 24);
    REQUIRE(a.crc32 == crc32_z(0, plain.data(), plain.size()));
  }
  SECTION("dimensions whose product leaves int64: 2^32-1 cubed") {
    REQUIRE_THROWS_WITH(decode_idx_gz(gzip(idx({0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}, 0)), f, 3),
                        Contains(f) && Contains("IDX data size") && Contains("overflows int64"));
  }
  SECTION("dimensions that claim 216 TB: rejected before any allocation") {
    REQUIRE_THROWS_WITH(decode_idx_gz(gzip(idx({60000, 60000, 60000}, 10)), f, 3),
                        Contains(f) && Contains("claim 216000000000000 data bytes") &&
                            Contains("limit of 2147483648"));
  }
  SECTION("dimensions that claim 1 GB of a 10-byte file: truncated, no 1 GB vector") {
    REQUIRE_THROWS_WITH(decode_idx_gz(gzip(idx({1000, 1000, 1000}, 10)), f, 3),
                        Contains("truncated: 10 of 1000000000 data bytes present"));
  }
  SECTION("only the gzip CRC-32 damaged: named as such, not as truncation") {
    auto gz = gzip(idx({2, 3, 4}, 24));
    gz[gz.size() - 8] ^= 0xFF;  // trailer: CRC-32 (4 bytes LE), ISIZE (4 bytes LE)
    REQUIRE_THROWS_WITH(decode_idx_gz(gz, f, 3),
                        Contains(f) && Contains("incorrect data check") &&
                            Contains("the CRC-32 in the gzip trailer does not match the data"));
  }
  SECTION("compressed file cut short") {
    auto gz = gzip(idx({2, 3, 4}, 24));
    gz.resize(gz.size() - 12);
    REQUIRE_THROWS_WITH(decode_idx_gz(gz, f, 3),
                        Contains(f) && Contains("the gzip data ends early"));
  }
  SECTION("not gzip; garbage after the gzip data; two members are one file") {
    REQUIRE_THROWS_WITH(decode_idx_gz(idx({2}, 2), f, 1),
                        Contains("not a gzip file (it must start with the bytes 1f 8b)"));
    auto gz = gzip(idx({2}, 2));
    gz.push_back(0);
    REQUIRE_THROWS_WITH(decode_idx_gz(gz, f, 1),
                        Contains("1 bytes after the end of the gzip data"));
    const auto plain = idx({2}, 2);
    auto first = gzip({plain.begin(), plain.begin() + 5});
    const auto second = gzip({plain.begin() + 5, plain.end()});
    first.insert(first.end(), second.begin(), second.end());
    IdxArray a = decode_idx_gz(first, f, 1);
    REQUIRE(a.data == std::vector<uint8_t>{plain[8], plain[9]});
  }
}
