// The cost model part by part (common/report/part_model.hpp).
#include "common/report/part_model.hpp"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>

#include "common/core/check.hpp"
#include "common/driver/run.hpp"

namespace ringzero {

namespace {

// "<part>_ms" for part p.
std::string key(int p) { return std::string(step_part_name(static_cast<StepPart>(p))) + "_ms"; }

}  // namespace

nlohmann::json parts_json(const StepParts& parts) {
  nlohmann::json j;
  for (int p = 0; p < kStepParts; ++p) j[key(p)] = parts.ms[p];
  j["step_ms"] = parts.total_ms();
  return j;
}

StepParts parts_from_json(const nlohmann::json& j) {
  StepParts parts;
  for (int p = 0; p < kStepParts; ++p) {
    RZ_CHECK(j.contains(key(p)) && j.at(key(p)).is_number(),
             "a step account without a number for " << key(p) << ": " << j.dump());
    parts.ms[p] = j.at(key(p)).get<double>();
  }
  return parts;
}

StepParts account_from_metrics(const std::string& path, const std::string& chapter) {
  std::ifstream in(path);
  RZ_CHECK(in, "--net-account " << path
                                << ": cannot read it; give the --metrics file of this chapter run "
                                   "at N = 1 with --attribute");
  nlohmann::json summary;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.value("type", "") == "summary") summary = j;
  }
  RZ_CHECK(!summary.is_null(), "--net-account " << path
                                                << ": no summary record (did the run end?); give "
                                                   "the --metrics file of a finished run at N = 1");
  RZ_CHECK(summary.contains("attribution"),
           "--net-account " << path
                            << ": the run has no step account; run it with --attribute");
  RZ_CHECK(chapter.empty() || summary.value("chapter", "") == chapter,
           "--net-account " << path << ": a run of " << summary.value("chapter", "?")
                            << ", not of " << chapter << "; give this chapter's run at N = 1");
  const nlohmann::json& a = summary.at("attribution");
  RZ_CHECK(a.value("steps", 0) > 0 && a.contains("ranks") && a.at("ranks").is_array() &&
               !a.at("ranks").empty(),
           "--net-account " << path << ": no step was measured; run at least 2 steps");
  RZ_CHECK(a.at("ranks").size() == 1,
           "--net-account " << path << ": a run at N = " << a.at("ranks").size()
                            << "; give the same chapter's run at N = 1 (one rank's share of the "
                               "batch)");
  return parts_from_json(a.at("ranks").at(0));
}

Interference interference_for(Overlap overlap, int64_t micro_batches, bool possible,
                              double factor) {
  Interference i{factor, 0, 0};
  if (!possible) return i;
  if (overlap == Overlap::backward) i.backward_share = 1.0 / static_cast<double>(micro_batches);
  if (overlap == Overlap::forward_and_backward) i.forward_share = i.backward_share = 1;
  return i;
}

StepParts predicted_compute(const StepParts& n1, const Interference& interference,
                            int optimizer_shards) {
  const double iota = interference.factor;
  RZ_CHECK(iota > 0 && std::isfinite(iota),
           "--net-interference " << iota << " must be a finite number > 0 (1: none)");
  RZ_CHECK(optimizer_shards >= 1, "predicted_compute: " << optimizer_shards << " shards");
  StepParts out;
  out[StepPart::forward] =
      n1[StepPart::forward] * (1 - interference.forward_share + interference.forward_share * iota);
  out[StepPart::backward] = n1[StepPart::backward] * (1 - interference.backward_share +
                                                      interference.backward_share * iota);
  out[StepPart::optimizer] = n1[StepPart::optimizer] / optimizer_shards;
  out[StepPart::copies] = n1[StepPart::copies];
  out[StepPart::other] = n1[StepPart::other];
  return out;
}

double measured_interference(const StepParts& n1, const StepParts& measured,
                             const Interference& interference) {
  // For each overlapped part, measured = n1·(1 − s) + n1·s·ι; summed over them, solved for ι.
  double overlapped = 0, rest = 0, seen = 0;
  for (const auto& [part, share] : {std::pair{StepPart::forward, interference.forward_share},
                                    std::pair{StepPart::backward, interference.backward_share}}) {
    if (share <= 0) continue;
    overlapped += n1[part] * share;
    rest += n1[part] * (1 - share);
    seen += measured[part];
  }
  return overlapped > 0 ? (seen - rest) / overlapped : 0;
}

StepParts rank0_account(const nlohmann::json& attribution) {
  for (const nlohmann::json& r : attribution.at("ranks"))
    if (r.value("rank", -1) == 0) return parts_from_json(r);
  RZ_CHECK(false, "an account without rank 0: " << attribution.dump());
  return {};
}

std::string format_part_comparison(const StepParts& predicted, const StepParts& measured,
                                   double factor_used, double factor_measured) {
  char line[160];
  std::string out =
      "step time by part, predicted (the N = 1 account and the network) vs measured (rank "
      "0), ms per step:\n";
  std::snprintf(line, sizeof line, "  %-30s %10s %10s %10s\n", "part", "predicted", "measured",
                "meas/pred");
  out += line;
  const auto row = [&](const std::string& name, double pred, double meas) {
    char ratio[16] = "-";
    if (pred > 0) std::snprintf(ratio, sizeof ratio, "%.2f", meas / pred);
    std::snprintf(line, sizeof line, "  %-30s %10.3f %10.3f %10s\n", name.c_str(), pred, meas,
                  ratio);
    out += line;
  };
  for (int p = 0; p < kStepParts; ++p)
    row(step_part_name(static_cast<StepPart>(p)), predicted.ms[p], measured.ms[p]);
  row("communication + peer_wait",
      predicted[StepPart::communication] + predicted[StepPart::peer_wait],
      measured[StepPart::communication] + measured[StepPart::peer_wait]);
  row("step", predicted.total_ms(), measured.total_ms());
  if (factor_measured > 0) {
    std::snprintf(line, sizeof line,
                  "interference (overlapped forward/backward at N over N = 1): used %.3f, "
                  "measured %.3f",
                  factor_used, factor_measured);
    out += line;
  } else {
    out += "interference: none (no compute ran beside communication)";
  }
  return out;
}

namespace {

class PartComparison : public Extension {
 public:
  void report(RunState& state, nlohmann::json& summary) override {
    if (state.rank != 0 || !summary.contains("prediction") ||
        !summary["prediction"].contains("parts"))
      return;
    nlohmann::json& parts = summary["prediction"]["parts"];
    if (!summary.contains("attribution") || summary["attribution"].value("steps", 0) == 0) {
      print0("step time by part: predicted " + parts.at("predicted").dump() +
             " (add --attribute to measure it beside)");
      return;
    }
    const StepParts n1 = parts_from_json(parts.at("n1"));
    const StepParts predicted = parts_from_json(parts.at("predicted"));
    const StepParts measured = rank0_account(summary["attribution"]);
    const Interference shares{parts.at("interference").get<double>(),
                              parts.at("forward_share").get<double>(),
                              parts.at("backward_share").get<double>()};
    const double iota = measured_interference(n1, measured, shares);
    print0(format_part_comparison(predicted, measured, shares.factor, iota));
    parts["measured"] = parts_json(measured);
    parts["measured_interference"] = iota;
  }
};

}  // namespace

std::unique_ptr<Extension> part_comparison_extension() {
  return std::make_unique<PartComparison>();
}

}  // namespace ringzero
