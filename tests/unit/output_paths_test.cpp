// What stands at an output or input path (issue 24, items 1 and 2): a symlink is followed and
// stays a symlink, a character device is written through and stays a device, a FIFO, socket or
// directory is refused at once (never opened: a FIFO would block), two outputs on one file are
// refused, and a JSON object that names a key twice (a safetensors header listing a tensor
// twice) is refused naming the file and the key.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include "common/io/atomic_file.hpp"
#include "common/io/safetensors.hpp"
#include "util.hpp"

using namespace ringzero;
using namespace ringzero::test;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

TEST_CASE("outputs: a symlink is followed, never replaced", "[atomic][harden]") {
  TempDir dir;
  const std::string target = dir.file("real.bin"), link = dir.file("link.bin");
  write_file_atomically(target, "old");
  fs::create_symlink(target, link);
  write_file_atomically(link, "new weights");
  REQUIRE(fs::is_symlink(link));  // the link is still a link ...
  REQUIRE(read_all(target) == "new weights");  // ... and the file it names has the bytes
  REQUIRE(resolve_output("--save-final", link).path == fs::canonical(target).string());
  {
    RecordFile records(link, "--metrics");
    records.append("{\"step\":1}\n");
  }
  REQUIRE(fs::is_symlink(link));
  REQUIRE(read_all(target) == "{\"step\":1}\n");
  // A link to a file not made yet: the file is created, the link stays.
  fs::create_symlink("later.bin", dir.file("dangling"));
  REQUIRE(resolve_output("--trace", dir.file("dangling")).path == dir.file("later.bin"));
  check_output_path("--trace", dir.file("dangling"));
  write_file_atomically(dir.file("dangling"), "trace");
  REQUIRE(fs::is_symlink(dir.file("dangling")));
  REQUIRE(read_all(dir.file("later.bin")) == "trace");
  // A link into a missing directory: named; a loop of links: refused.
  fs::create_symlink(dir.file("missing/x"), dir.file("nowhere"));
  REQUIRE_THROWS_WITH(check_output_path("--trace", dir.file("nowhere")),
                      Contains("--trace " + dir.file("nowhere") + ": directory " +
                               dir.file("missing") + " does not exist"));
  fs::create_symlink(dir.file("loop2"), dir.file("loop1"));
  fs::create_symlink(dir.file("loop1"), dir.file("loop2"));
  REQUIRE_THROWS_WITH(check_output_path("--trace", dir.file("loop1")),
                      Contains("is a loop of symbolic links"));
}

TEST_CASE("outputs: a character device is written through, a FIFO or socket is refused",
          "[atomic][harden]") {
  TempDir dir;
  // /dev/null itself: written through, still a character device afterwards.
  write_file_atomically("/dev/null", "2.6 MB of weights, in spirit");
  check_output_path("--save-final", "/dev/null");
  struct stat st {};
  REQUIRE(stat("/dev/null", &st) == 0);
  REQUIRE(S_ISCHR(st.st_mode));
  RecordFile null_records("/dev/null", "--metrics");
  null_records.append("{}\n");
  REQUIRE(resolve_output("--metrics", "/dev/null").device);
  // A private device node where root may make one: written through, not replaced.
  if (geteuid() == 0 && mknod(dir.file("null").c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0) {
    write_file_atomically(dir.file("null"), "x");
    REQUIRE(stat(dir.file("null").c_str(), &st) == 0);
    REQUIRE(S_ISCHR(st.st_mode));
  }
  REQUIRE(mkfifo(dir.file("fifo").c_str(), 0644) == 0);
  for (const char* flag : {"--metrics", "--save-final"})
    REQUIRE_THROWS_WITH(check_output_path(flag, dir.file("fifo")),
                        Contains(std::string(flag) + " " + dir.file("fifo") +
                                 " is a FIFO (named pipe)") &&
                            Contains("must be a regular file"));
  REQUIRE_THROWS_WITH(RecordFile(dir.file("fifo"), "--metrics"), Contains("is a FIFO"));
  REQUIRE_THROWS_WITH(write_file_atomically(dir.file("fifo"), "x"), Contains("is a FIFO"));
  REQUIRE(file_kind(dir.file("fifo")) == "a FIFO (named pipe)");  // untouched
}

TEST_CASE("outputs: two flags on one file are refused, naming both", "[atomic][harden]") {
  TempDir dir;
  const std::string f = dir.file("out"), g = dir.file("other");
  check_distinct_outputs({{"--metrics", f}, {"--trace", g}, {"--save-final", ""}});
  REQUIRE_THROWS_WITH(check_distinct_outputs({{"--metrics", f}, {"--trace", f}}),
                      Contains("--metrics " + f + " and --trace " + f + " name the same file"));
  // The same file by another spelling, through a symlink, or a hard link.
  REQUIRE_THROWS_WITH(
      check_distinct_outputs({{"--metrics", f}, {"--trace", dir.file("./x/../out")}}),
      Contains("name the same file"));
  write_file_atomically(f, "x");
  fs::create_symlink(f, dir.file("sym"));
  fs::create_hard_link(f, dir.file("hard"));
  REQUIRE_THROWS_WITH(check_distinct_outputs({{"--save-final", dir.file("sym")},
                                              {"--save-optimizer-state", f}}),
                      Contains("--save-final " + dir.file("sym") + " and --save-optimizer-state"));
  REQUIRE_THROWS_WITH(
      check_distinct_outputs({{"--save-final", dir.file("hard")}, {"--metrics", f}}),
      Contains("name the same file"));
  // Character devices take any number of writers.
  check_distinct_outputs({{"--metrics", "/dev/null"}, {"--trace", "/dev/null"}});
}

TEST_CASE("inputs: only regular files are opened; a FIFO or directory is named as such",
          "[data][harden]") {
  TempDir dir;
  REQUIRE(mkfifo(dir.file("fifo").c_str(), 0644) == 0);
  fs::create_directory(dir.file("d"));
  REQUIRE_THROWS_WITH(load_safetensors(dir.file("fifo")),
                      Contains("safetensors file " + dir.file("fifo") +
                               " is a FIFO (named pipe), not a regular file"));
  REQUIRE_THROWS_WITH(load_safetensors(dir.file("d")), Contains("is a directory, not a regular"));
  REQUIRE_THROWS_WITH(load_safetensors(dir.file("none")), Contains("none: no such file"));
  REQUIRE_THROWS_WITH(check_input_file("dataset file", dir.file("fifo"), "fix"),
                      Contains("dataset file " + dir.file("fifo") + " is a FIFO") &&
                          Contains("; fix"));
}

TEST_CASE("JSON that names a key twice is refused: safetensors headers, nested objects",
          "[safetensors][harden]") {
  // Two tensors named "w": nlohmann's parser would keep the second one silently.
  const std::string header =
      R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
      R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  bytes += header + std::string(8, '\0');
  const std::span<const uint8_t> span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  REQUIRE_THROWS_WITH(parse_safetensors(span, "swap.safetensors"),
                      Contains("swap.safetensors header: the JSON names \"w\" twice"));
  REQUIRE_THROWS_WITH(parse_json_unique_keys(R"({"a":{"b":1,"b":2}})", "m.json"),
                      Contains("m.json: the JSON names \"b\" twice"));
  // The same key in two different objects is fine.
  const nlohmann::json ok = parse_json_unique_keys(R"({"a":{"b":1},"c":[{"b":2},{"b":3}]})", "x");
  REQUIRE(ok["c"][1]["b"] == 3);
}
