// The ZeRO memory formulas (common/zero/zero_memory.hpp) against two tables: a
// 7B model in fp32 + Adam on 8 ranks (docs/memory.md), and the ZeRO paper's Figure 1 (Rajbhandari
// et al., SC 2020: 7.5B parameters, mixed precision + Adam, K_os = 12, 64 ranks).
#include <catch2/catch.hpp>

#include "common/zero/memory_calculator.hpp"
#include "common/zero/zero_memory.hpp"

using namespace ringzero;

TEST_CASE("fp32 + Adam, 7B parameters, 8 ranks: 112 / 63 / 38.5 / 14 GB") {
  const double psi = 7e9;
  // Every value is a multiple of 1/8 of an integer number of bytes: exact in double.
  CHECK(zero_model_state_bytes(0, psi, 8).total() == 112e9);
  CHECK(zero_model_state_bytes(1, psi, 8).total() == 63e9);
  CHECK(zero_model_state_bytes(2, psi, 8).total() == 38.5e9);
  CHECK(zero_model_state_bytes(3, psi, 8).total() == 14e9);
  // The DDP breakdown: 28 GB parameters, 28 GB gradients, 56 GB optimizer state.
  const ModelStateBytes z2 = zero_model_state_bytes(2, psi, 8);
  CHECK(z2.parameters == 28e9);
  CHECK(z2.gradients == 3.5e9);
  CHECK(z2.optimizer_state == 7e9);
  CHECK(gigabytes(zero_model_state_bytes(0, psi, 8).total()) == "112");
  CHECK(gigabytes(zero_model_state_bytes(1, psi, 8).total()) == "63");
  CHECK(gigabytes(zero_model_state_bytes(2, psi, 8).total()) == "38.5");
  CHECK(gigabytes(zero_model_state_bytes(3, psi, 8).total()) == "14");
}

TEST_CASE(
    "mixed precision + Adam (K = 12), 7.5B parameters, 64 ranks: the paper's 120 / 31.4 / 16.6 / "
    "1.9 GB") {
  const double psi = 7.5e9;
  CHECK(zero_model_state_bytes(0, psi, 64, kMixedPrecisionAdam).total() == 120e9);
  CHECK(zero_model_state_bytes(1, psi, 64, kMixedPrecisionAdam).total() ==
        31.40625e9);  // 2Ψ + 2Ψ + 12Ψ/64
  CHECK(zero_model_state_bytes(2, psi, 64, kMixedPrecisionAdam).total() ==
        16.640625e9);  // 2Ψ + 14Ψ/64
  CHECK(zero_model_state_bytes(3, psi, 64, kMixedPrecisionAdam).total() == 1.875e9);  // 16Ψ/64
  CHECK(gigabytes(120e9) == "120");
  CHECK(gigabytes(31.40625e9) == "31.4");
  CHECK(gigabytes(16.640625e9) == "16.6");
  CHECK(gigabytes(1.875e9) == "1.9");
  CHECK(gigabytes(0.234375e9) == "0.23");  // 2Ψ/64 of gradients in ZeRO-2
  CHECK(gigabytes(0) == "0");
}

TEST_CASE("formula text and the calculator's table") {
  CHECK(zero_formula_text(0) == "(4 + 4 + 8)Ψ");
  CHECK(zero_formula_text(1) == "4Ψ + 4Ψ + 8Ψ/N");
  CHECK(zero_formula_text(2) == "4Ψ + (4 + 8)Ψ/N");
  CHECK(zero_formula_text(3) == "(4 + 4 + 8)Ψ/N");
  CHECK(zero_formula_text(1, kMixedPrecisionAdam) == "2Ψ + 2Ψ + 12Ψ/N");
  const std::string table = zero_memory_table(7e9, 8);
  for (const char* row :
       {"DDP     | (4 + 4 + 8)Ψ         |      28 GB |      28 GB |      56 GB |     112 GB",
        "ZeRO-1  | 4Ψ + 4Ψ + 8Ψ/N       |      28 GB |      28 GB |       7 GB |      63 GB",
        "ZeRO-2  | 4Ψ + (4 + 8)Ψ/N      |      28 GB |     3.5 GB |       7 GB |    38.5 GB",
        "ZeRO-3  | (4 + 4 + 8)Ψ/N       |     3.5 GB |     3.5 GB |       7 GB |      14 GB"})
    CHECK_THAT(table, Catch::Contains(row));
  const std::string paper = zero_memory_table(7.5e9, 64, kMixedPrecisionAdam);
  for (const char* total : {"|     120 GB", "|    31.4 GB", "|    16.6 GB", "|     1.9 GB"})
    CHECK_THAT(paper, Catch::Contains(total));
}

TEST_CASE(
    "ring traffic per rank per step: 2(N-1)/N·4Ψ for DDP, ZeRO-1, ZeRO-2; 3(N-1)/N·4Ψ for ZeRO-3") {
  for (int N : {1, 2, 3, 4, 8}) {
    const double psi = 1200;  // divisible by 1..4 and 8
    for (int stage = 0; stage <= 2; ++stage)
      CHECK(zero_bytes_sent_per_rank(stage, psi, N) == 2.0 * (N - 1) * 4 * psi / N);
    CHECK(zero_bytes_sent_per_rank(3, psi, N) == 3.0 * (N - 1) * 4 * psi / N);
  }
  CHECK(zero_bytes_sent_per_rank(0, 7e9, 8) == 49e9);
}
