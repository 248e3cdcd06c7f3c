// compare_runs: how far apart two training runs ended, for the equivalence-chain tests.
//
//   compare_runs A.safetensors B.safetensors [A.jsonl B.jsonl] [--atol X] [--loss-atol Y]
//   [--bitwise] [--start S.safetensors --rel-l2 R] [--adam-bound LR --steps T]
//
// Compares every tensor of two safetensors files (final parameters, or any state saved with
// the same names) and, when given, the "loss" of every {"type":"step"} line of two metrics
// files. Prints the largest absolute differences; exits 0 when within tolerance, 1 otherwise.
// --bitwise demands identical float bits (the chain's bitwise links).
// --start S --rel-l2 R also demands ||A - B||_2 <= R * ||A - S||_2 over all elements of all
// tensors: the runs' disagreement measured against how far run A moved from the common start S
// (both runs' initial parameters). This is the machine-independent criterion of the links that
// are not bitwise under Adam (see tests/chapters/ch02_vs_ch01.sh): a last-bit difference on an
// element whose gradient is ~0 may move that one element by several lr, but cannot move the
// whole parameter vector, whereas a wrong sample, scale or missing gradient moves all of it.
// --adam-bound LR --steps T sets --atol to the most two AdamW runs from the same start can
// differ on any element after T steps of learning rate LR (betas 0.9, 0.999, the defaults):
// 2 · LR · sum_t R_t, with R_t the bound on |m̂_t / sqrt(v̂_t)| below. Weight decay multiplies
// both runs' parameters by the same (1 - lr·wd) < 1, so it only shrinks a difference.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "common/io/safetensors.hpp"

using namespace ringzero;

// The largest |m̂_t / sqrt(v̂_t)| Adam can take at step t, over every gradient history
// (Kingma & Ba, "Adam", 2015, §2.1 bound the same ratio by (1 - beta1)/sqrt(1 - beta2) in the
// sparse case; this is the exact bound for any history). With m_t = (1-b1) Σ_k b1^k g_{t-k} and
// v_t = (1-b2) Σ_k b2^k g_{t-k}^2 (k < t), Cauchy-Schwarz on Σ (b1^k / b2^{k/2}) (b2^{k/2} g)
// gives |m_t| <= (1-b1) sqrt(Σ_k (b1²/b2)^k) sqrt(v_t / (1-b2)); with the bias corrections
// R_t = (1-b1)/(1-b1^t) · sqrt((1-b2^t)/(1-b2)) · sqrt(Σ_{k<t} (b1²/b2)^k). R_1 = 1 (Adam's
// first step is lr·sign(g)); R_20 = 1.156; Σ_{t<=20} R_t = 21.18. eps only shrinks the ratio.
static double adam_ratio_bound(int t, double b1 = 0.9, double b2 = 0.999) {
  double geometric = 0;
  for (int k = 0; k < t; ++k) geometric += std::pow(b1 * b1 / b2, k);
  return (1 - b1) / (1 - std::pow(b1, t)) * std::sqrt((1 - std::pow(b2, t)) / (1 - b2)) *
         std::sqrt(geometric);
}

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
  double atol = -1, loss_atol = 0;  // atol < 0: no elementwise limit (with --rel-l2)
  double rel_l2 = -1;
  std::string start;
  double adam_lr = 0;
  int steps = 0;
  bool bitwise = false;
  app.add_option("a", a)->required();
  app.add_option("b", b)->required();
  app.add_option("metrics_a", ma);
  app.add_option("metrics_b", mb);
  app.add_option("--atol", atol, "max |a - b| over tensor elements");
  app.add_option("--loss-atol", loss_atol, "max |a - b| over per-step losses");
  app.add_flag("--bitwise", bitwise, "require identical bits");
  app.add_option("--start", start, "the runs' common initial parameters (for --rel-l2)");
  app.add_option("--rel-l2", rel_l2, "max ||a - b||_2 / ||a - start||_2 over all elements");
  app.add_option("--adam-bound", adam_lr, "set --atol to AdamW's bound at this lr (with --steps)");
  app.add_option("--steps", steps, "optimizer steps both runs took (for --adam-bound)");
  CLI11_PARSE(app, argc, argv);
  if (atol < 0 && rel_l2 < 0) atol = 0;  // no criterion given: the values must be equal
  if (adam_lr > 0) {
    if (steps <= 0) {
      std::fprintf(stderr, "compare_runs: --adam-bound needs --steps T > 0\n");
      return 2;
    }
    double sum = 0;
    for (int t = 1; t <= steps; ++t) sum += adam_ratio_bound(t);
    // The updates are computed in float32: allow their relative rounding (1e-6) on top.
    atol = 2 * adam_lr * sum * (1 + 1e-6);
    std::printf("AdamW bound after %d steps of lr %g: every element within %.4g\n", steps, adam_lr,
                atol);
  }
  try {
    if ((rel_l2 >= 0) != !start.empty())
      throw std::runtime_error("--rel-l2 and --start go together");
    auto ta = load_safetensors(a), tb = load_safetensors(b);
    const auto ts = start.empty() ? decltype(ta){} : load_safetensors(start);
    double diff_sq = 0, moved_sq = 0;  // ||a - b||^2 and ||a - start||^2, in double
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
      const NamedTensor* s0 = nullptr;
      if (!start.empty()) {
        auto is = ts.find(name);
        if (is == ts.end() || is->second.shape != t.shape) {
          std::printf("tensor %s missing or reshaped in %s\n", name.c_str(), start.c_str());
          ok = false;
          continue;
        }
        s0 = &is->second;
      }
      for (size_t i = 0; i < t.values.size(); ++i) {
        double d = std::fabs(static_cast<double>(t.values[i]) - it->second.values[i]);
        diff_sq += d * d;
        if (s0) {
          const double m = static_cast<double>(t.values[i]) - s0->values[i];
          moved_sq += m * m;
        }
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
    ok = ok && (bitwise ? bit_mismatches == 0 : atol < 0 || max_diff <= atol);
    if (!start.empty()) {
      const double rel = std::sqrt(diff_sq) / std::sqrt(moved_sq);  // NaN if nothing moved: fails
      std::printf("tensors: ||a-b|| = %.3g, ||a-start|| = %.3g, relative %.3g (limit %.3g)\n",
                  std::sqrt(diff_sq), std::sqrt(moved_sq), rel, rel_l2);
      ok = ok && moved_sq > 0 && rel <= rel_l2;
    }
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
