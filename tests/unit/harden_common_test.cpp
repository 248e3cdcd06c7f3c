// The common/ pieces of issue 9 that need no MPI, with their expected values written out:
// checked int64 sizes (item 3), the data fingerprint (item 1), the atomic writer and the
// output-path check (item 4), and the model-state formula of each optimizer (item 10).
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "common/core/checked.hpp"
#include "common/core/optim.hpp"
#include "common/data/data.hpp"
#include "common/driver/config.hpp"
#include "common/io/atomic_file.hpp"
#include "common/zero/zero_memory.hpp"
#include "util.hpp"

using namespace ringzero;
using namespace ringzero::test;
using Catch::Matchers::Contains;

namespace {
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
}  // namespace

TEST_CASE("checked int64 arithmetic names what overflowed", "[checked][harden]") {
  REQUIRE(checked_mul(4, int64_t{1} << 60, "x") == int64_t{1} << 62);
  REQUIRE_THROWS_WITH(checked_mul(4, int64_t{1} << 62, "world_size x K", "fix it"),
                      Contains("world_size x K: 4 x 4611686018427387904 overflows int64; fix it"));
  REQUIRE(checked_add(kMax - 1, 1, "s") == kMax);
  REQUIRE_THROWS_WITH(checked_add(kMax, 1, "s"), Contains("s: 9223372036854775807 + 1 overflows"));
  REQUIRE(checked_mul(-1, kMax, "neg") == -kMax);
  const std::vector<int64_t> dims{int64_t{1} << 31, int64_t{1} << 31, 4};
  REQUIRE_THROWS_WITH(checked_product(dims, "dims"), Contains("dims: 4611686018427387904 x 4"));
}

TEST_CASE("derived sizes of the flags: parameters, steps, world_size x K", "[checked][harden]") {
  REQUIRE(num_parameters({784, 512, 512, 10}, "--hidden-sizes") == 669706);
  REQUIRE(num_parameters({1024, 1024, 1024, 256}, "--hidden-sizes") == 2361600);
  REQUIRE_THROWS_WITH(num_parameters({1024, int64_t{1} << 62, 256}, "--hidden-sizes"),
                      Contains("--hidden-sizes parameter count: 1024 x 4611686018427387904"));
  REQUIRE(total_steps_checked(5, 937, -1) == 4685);
  REQUIRE(total_steps_checked(kMax, 937, 10) == 10);  // capped by --max-steps: no overflow
  REQUIRE(total_steps_checked(2, 937, 5000) == 1874);
  REQUIRE_THROWS_WITH(total_steps_checked(kMax, 15, -1),
                      Contains("--epochs x steps per epoch: 9223372036854775807 x 15 overflows"));
  TrainConfig c;
  c.grad_accum_steps = int64_t{1} << 62;
  REQUIRE_THROWS_WITH(validate(c, 4),
                      Contains("world_size x --grad-accum-steps: 4 x 4611686018427387904"));
  c = TrainConfig{};
  c.hidden_sizes = {int64_t{1} << 31};
  REQUIRE_THROWS_WITH(validate(c, 1), Contains("--hidden-sizes gives 1707249500170 parameters") &&
                                          Contains("more than this machine's"));
  c = TrainConfig{};
  c.eval_every_epoch = 2;
  REQUIRE_THROWS_WITH(validate(c, 1), Contains("--eval-every-epoch 2 must be 1"));
  REQUIRE(physical_memory_bytes() > (int64_t{1} << 20));
}

TEST_CASE("dataset fingerprint: CRC-32 of the decoded content, and the source",
          "[data][fingerprint][harden]") {
  const Dataset a = make_synthetic(10, 4, 2, 7, 1);
  const Dataset b = make_synthetic(10, 4, 2, 7, 1);
  const Dataset c = make_synthetic(10, 4, 2, 8, 1);
  REQUIRE(a.crc32 == b.crc32);
  REQUIRE(a.crc32 != c.crc32);
  REQUIRE(a.source == "synthetic n=10 in=4 out=2 seed=7 stream=1");
  uLong crc = crc32_z(0, Z_NULL, 0);
  crc = crc32_z(crc, reinterpret_cast<const Bytef*>(a.inputs.data()), 40 * sizeof(float));
  crc = crc32_z(crc, reinterpret_cast<const Bytef*>(a.targets.data()), 20 * sizeof(float));
  REQUIRE(a.crc32 == static_cast<uint32_t>(crc));
}

TEST_CASE("write_file_atomically replaces whole files; check_output_path fails early",
          "[atomic][harden]") {
  TempDir dir;
  const std::string path = dir.file("out.bin");
  write_file_atomically(path, "first version");
  REQUIRE(read_all(path) == "first version");
  write_file_atomically(path, std::string(100000, 'x'));
  REQUIRE(read_all(path) == std::string(100000, 'x'));
  // No temporary file is left behind.
  int files = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir.path)) ++files;
  REQUIRE(files == 1);
  // The file has the usual permissions (0666 & ~umask), not mkstemp's 0600.
  struct stat st {};
  REQUIRE(stat(path.c_str(), &st) == 0);
  const mode_t mask = umask(0);
  umask(mask);
  REQUIRE((st.st_mode & 0777) == (0666 & ~mask));

  REQUIRE_THROWS_WITH(
      write_file_atomically(dir.file("no/such/x"), "y"),
      Contains("cannot write " + dir.file("no/such/x")) && Contains("No such file or directory"));
  // A directory where the file should be: refused, the directory is untouched.
  std::filesystem::create_directory(dir.file("d"));
  REQUIRE_THROWS_WITH(write_file_atomically(dir.file("d"), "y"), Contains("is a directory"));
  REQUIRE(std::filesystem::is_directory(dir.file("d")));

  check_output_path("--save-final", "");  // off: nothing to check
  check_output_path("--save-final", path);
  REQUIRE(read_all(path) == std::string(100000, 'x'));  // the check does not touch the target
  REQUIRE_THROWS_WITH(
      check_output_path("--save-final", dir.file("missing/w.safetensors")),
      Contains("--save-final " + dir.file("missing/w.safetensors")) && Contains("does not exist"));
  REQUIRE_THROWS_WITH(check_output_path("--trace", dir.file("d"), "trace.json"),
                      Contains("--trace " + dir.file("d") + " is a directory") &&
                          Contains("e.g. " + dir.file("d") + "/trace.json"));
  if (geteuid() != 0) {  // root writes anywhere: the permission case needs a normal user
    std::filesystem::create_directory(dir.file("ro"));
    chmod(dir.file("ro").c_str(), 0555);
    REQUIRE_THROWS_WITH(check_output_path("--metrics", dir.file("ro/m.jsonl")),
                        Contains("--metrics") && Contains("Permission denied"));
  }
  REQUIRE_THROWS_WITH(check_output_path("--metrics", "/proc/m.jsonl"),
                      Contains("--metrics /proc/m.jsonl: cannot create a file in /proc"));
}

TEST_CASE("the model-state formula follows the optimizer: AdamW 16Ψ, SGD 8Ψ, momentum 12Ψ",
          "[memory][harden]") {
  REQUIRE(full_copy_formula_text(fp32_state_bytes("adamw", 0)) == "4Ψ + 4Ψ + 8Ψ = 16Ψ");
  REQUIRE(full_copy_formula_text(fp32_state_bytes("sgd", 0)) == "4Ψ + 4Ψ = 8Ψ");
  REQUIRE(full_copy_formula_text(fp32_state_bytes("sgd", 0.9)) == "4Ψ + 4Ψ + 4Ψ = 12Ψ");
  REQUIRE(zero_formula_text(1, fp32_state_bytes("sgd", 0)) == "4Ψ + 4Ψ");
  REQUIRE(zero_formula_text(2, fp32_state_bytes("sgd", 0.9)) == "4Ψ + (4 + 4)Ψ/N");
  REQUIRE(zero_formula_text(3, fp32_state_bytes("adamw", 0)) == "(4 + 4 + 8)Ψ/N");
  // And the optimizers allocate exactly K bytes per parameter (the ledger's optimizer_state).
  const int64_t psi = 1000;
  for (auto [name, momentum, k] :
       {std::tuple{"adamw", 0.0f, 8}, std::tuple{"sgd", 0.0f, 0}, std::tuple{"sgd", 0.9f, 4}}) {
    const int64_t before = Ledger::get().current(MemTag::optimizer_state);
    {
      if (std::string(name) == "sgd") {
        SGD sgd(psi, SGDOptions{1e-3f, momentum, 0.0f});
        REQUIRE(Ledger::get().current(MemTag::optimizer_state) - before == k * psi);
      } else {
        AdamW adamw({psi}, AdamWOptions{});
        REQUIRE(Ledger::get().current(MemTag::optimizer_state) - before == k * psi);
      }
    }
    REQUIRE(fp32_state_bytes(name, momentum).optimizer == k);
  }
}
