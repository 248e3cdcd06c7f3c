// compare_runs: how far apart two training runs ended, for the equivalence-chain tests.
//
//   compare_runs A.safetensors B.safetensors [A.jsonl B.jsonl] [--atol X] [--loss-atol Y]
//   [--bitwise]
//
// Compares every tensor of two safetensors files (final parameters, or any state saved with
// the same names) and, when given, the "loss" of every {"type":"step"} line of two metrics
// files. Prints the largest absolute differences; exits 0 when within tolerance, 1 otherwise.
// --bitwise demands identical float bits (the chain's 05→08 links).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "common/safetensors.hpp"

using namespace ringzero;

static std::vector<double> losses(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::vector<double> out;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.at("type") == "step") out.push_back(j.at("loss").get<double>());
  }
  return out;
}

int main(int argc, char** argv) {
  CLI::App app{"compare two runs' final tensors and loss histories"};
  std::string a, b, ma, mb;
  double atol = 0, loss_atol = 0;
  bool bitwise = false;
  app.add_option("a", a)->required();
  app.add_option("b", b)->required();
  app.add_option("metrics_a", ma);
  app.add_option("metrics_b", mb);
  app.add_option("--atol", atol, "max |a - b| over tensor elements");
  app.add_option("--loss-atol", loss_atol, "max |a - b| over per-step losses");
  app.add_flag("--bitwise", bitwise, "require identical bits");
  CLI11_PARSE(app, argc, argv);
  try {
    auto ta = load_safetensors(a), tb = load_safetensors(b);
    bool ok = ta.size() == tb.size();
    if (!ok) std::printf("tensor counts differ: %zu vs %zu\n", ta.size(), tb.size());
    double max_diff = 0;
    std::string worst;
    int64_t bit_mismatches = 0;
    for (const auto& [name, t] : ta) {
      auto it = tb.find(name);
      if (it == tb.end() || it->second.shape != t.shape) {
        std::printf("tensor %s missing or reshaped in %s\n", name.c_str(), b.c_str());
        ok = false;
        continue;
      }
      for (size_t i = 0; i < t.values.size(); ++i) {
        double d = std::fabs(static_cast<double>(t.values[i]) - it->second.values[i]);
        if (std::isnan(d)) d = INFINITY;  // a NaN on either side is the largest difference there is
        if (d > max_diff) {
          max_diff = d;
          worst = name;
        }
        if (std::memcmp(&t.values[i], &it->second.values[i], 4) != 0) ++bit_mismatches;
      }
    }
    std::printf("tensors: max |a-b| = %.3g (in %s), %lld elements differ bitwise\n", max_diff,
                worst.c_str(), static_cast<long long>(bit_mismatches));
    ok = ok && (bitwise ? bit_mismatches == 0 : max_diff <= atol);
    if (!ma.empty()) {
      auto la = losses(ma), lb = losses(mb);
      double max_loss = 0;
      int64_t loss_bits = 0;
      for (size_t i = 0; i < std::min(la.size(), lb.size()); ++i) {
        const double d = std::fabs(la[i] - lb[i]);
        max_loss = std::max(max_loss, std::isnan(d) ? INFINITY : d);
        loss_bits += la[i] != lb[i];
      }
      std::printf("losses: %zu vs %zu steps, max |a-b| = %.3g, %lld differ\n", la.size(), lb.size(),
                  max_loss, static_cast<long long>(loss_bits));
      ok = ok && la.size() == lb.size() && !la.empty() &&
           (bitwise ? loss_bits == 0 : max_loss <= loss_atol);
    }
    std::printf("%s\n", ok ? "MATCH" : "MISMATCH");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "compare_runs: %s\n", e.what());
    return 2;
  }
}
