// The cost model part by part (common/report/part_model.hpp): the compute taken from an N = 1
// account, the interference factor and its inverse, and the measured forward/backward split in
// predict_step. The inputs are round numbers, so the tolerances are float rounding (1e-9
// relative), not modelling slack.
#include <cstdio>
#include <fstream>
#include <string>

#include "common/report/cost_model.hpp"
#include "common/report/part_model.hpp"

#include <catch2/catch.hpp>

using namespace ringzero;
using Catch::Matchers::Contains;

namespace {

const Network kNet{10.0, 1.0};  // α = 10 µs, β = 1 Gbit/s

// Ring all-reduces of `elements` fp32 elements each at N ranks: one call per bucket.
TrafficPerStep ring_buckets(const std::vector<double>& elements, int n) {
  OpTraffic r;
  for (double e : elements) {
    r.calls += 1;
    r.messages_sent += 2 * (n - 1), r.messages_received += 2 * (n - 1);
    r.bytes_sent += 2 * (n - 1) * 4 * e / n, r.bytes_received += 2 * (n - 1) * 4 * e / n;
  }
  return {{"ring_all_reduce", std::vector<OpTraffic>(n, r)}};
}

Interference none_for_zero() { return interference_for(Overlap::backward, 1, true, 1.0); }

StepParts parts(double fw, double bw, double opt, double comm, double peer, double copies,
                double other) {
  StepParts p;
  p.ms = {fw, bw, opt, comm, peer, copies, other};
  return p;
}

// A --metrics file whose last line is a summary record with `ranks` identical accounts.
std::string write_metrics(const std::string& name, int ranks, bool with_account) {
  const std::string path = "part_model_test_" + name + ".jsonl";
  nlohmann::json summary = {{"type", "summary"}, {"chapter", "05_ddp_buckets"}, {"ms_per_step", 10.0}};
  if (with_account) {
    nlohmann::json rows = nlohmann::json::array();
    for (int r = 0; r < ranks; ++r) {
      nlohmann::json row = parts_json(parts(2, 4, 1, 0.5, 0.25, 0.125, 0.375));
      row["rank"] = r;
      rows.push_back(row);
    }
    summary["attribution"] = {{"steps", 5}, {"ranks", rows}, {"late_rank", nullptr}};
  }
  std::ofstream(path) << R"({"type": "step", "step": 1, "loss": 2.3})" << "\n" << summary.dump() << "\n";
  return path;
}

}  // namespace

TEST_CASE("measured forward/backward that follow the 2/3 rule predict what the rule does",
          "[part_model]") {
  const int N = 4;
  const std::vector<double> sizes{300000, 200000, 100000};
  const TrafficPerStep t = ring_buckets(sizes, N);
  for (const double compute : {3.0, 30.0, 300.0}) {
    StepSchedule rule{.compute_ms = compute, .overlap = Overlap::backward, .sizes = sizes};
    StepSchedule measured = rule;
    measured.forward_ms = compute / 3, measured.backward_ms = 2 * compute / 3;
    const StepPrediction a = predict_step(kNet, t, N, rule), b = predict_step(kNet, t, N, measured);
    REQUIRE(a.replayed);
    REQUIRE(b.predicted_ms == Approx(a.predicted_ms).epsilon(1e-9));
  }
  // A backward half of compute hides less than two thirds of it: the step is longer, by at
  // most the sixth of compute that no longer overlaps.
  const StepSchedule two_thirds{.compute_ms = 30, .overlap = Overlap::backward, .sizes = sizes};
  StepSchedule half = two_thirds;
  half.forward_ms = 10, half.backward_ms = 15;  // optimizer 5 ms, after backward
  const double a = predict_step(kNet, t, N, two_thirds).predicted_ms;
  const double b = predict_step(kNet, t, N, half).predicted_ms;
  REQUIRE(b >= a - 1e-9);
  REQUIRE(b <= a + 5 + 1e-9);
  // Errors: parts longer than compute.
  half.backward_ms = 25;
  REQUIRE_THROWS_WITH(predict_step(kNet, t, N, half), Contains("within compute 30 ms"));
}

TEST_CASE("ZeRO-3: measured forward and backward replay, the optimizer follows them",
          "[part_model]") {
  const int N = 4;
  const std::vector<double> elements{400000, 200000};
  TrafficPerStep t;
  for (const char* op : {"ring_all_gather", "ring_reduce_scatter"}) {
    const double copies = std::string(op) == "ring_all_gather" ? 2 : 1;
    OpTraffic r;
    for (double n : elements) {
      r.calls += copies;
      r.messages_sent += copies * (N - 1), r.messages_received += copies * (N - 1);
      r.bytes_sent += copies * (N - 1) * 4 * n / N, r.bytes_received += copies * (N - 1) * 4 * n / N;
    }
    t[op].assign(N, r);
  }
  StepSchedule s{.compute_ms = 100, .overlap = Overlap::forward_and_backward, .sizes = elements};
  s.forward_ms = 30, s.backward_ms = 60;  // the optimizer's 10 ms after the replay
  const StepPrediction p = predict_step(kNet, t, N, s);
  REQUIRE(p.replayed);
  std::vector<double> g;
  for (double n : elements) g.push_back(ring_phase_ms(kNet, N, 4 * n));
  // + 0.020: the loss all-reduce, ceil(log2 4) = 2 rounds of α = 10 µs, after the step.
  REQUIRE(p.predicted_ms ==
          Approx(replay_zero3_prefetch(30, 60, elements, g, g) + 10 + 0.020).epsilon(1e-9));
}

TEST_CASE("the compute at N: the N = 1 account, overlapped parts slowed by the interference",
          "[part_model]") {
  const StepParts n1 = parts(2, 4, 1, 0.5, 0.25, 0.125, 0.375);
  // DDP at K = 2: half of backward runs beside communication.
  const Interference ddp = interference_for(Overlap::backward, 2, true, 1.5);
  REQUIRE(ddp.forward_share == 0);
  REQUIRE(ddp.backward_share == 0.5);
  const StepParts c = predicted_compute(n1, ddp);
  REQUIRE(c[StepPart::forward] == 2);
  REQUIRE(c[StepPart::backward] == Approx(4 * (0.5 + 0.5 * 1.5)).epsilon(1e-12));
  REQUIRE(c[StepPart::optimizer] == 1);
  REQUIRE(c[StepPart::copies] == 0.125);
  REQUIRE(c[StepPart::other] == 0.375);  // n1's communication, peer_wait: not carried over
  REQUIRE(c[StepPart::communication] == 0);
  REQUIRE(c[StepPart::peer_wait] == 0);
  // The measured interference inverts it.
  REQUIRE(measured_interference(n1, c, ddp) == Approx(1.5).epsilon(1e-12));
  // ZeRO-3's prefetch: forward and backward both.
  const Interference z3 = interference_for(Overlap::forward_and_backward, 1, true, 1.25);
  const StepParts c3 = predicted_compute(n1, z3);
  REQUIRE(c3[StepPart::forward] == Approx(2.5).epsilon(1e-12));
  REQUIRE(c3[StepPart::backward] == Approx(5.0).epsilon(1e-12));
  REQUIRE(measured_interference(n1, c3, z3) == Approx(1.25).epsilon(1e-12));
  // No core for the communication thread, or nothing overlapped: nothing slows, nothing measured.
  for (const Interference& none : {interference_for(Overlap::backward, 1, false, 2.0),
                                   interference_for(Overlap::none, 1, true, 2.0)}) {
    const StepParts same = predicted_compute(n1, none);
    REQUIRE(same[StepPart::backward] == 4);
    REQUIRE(measured_interference(n1, same, none) == 0);
  }
  REQUIRE_THROWS_WITH(predicted_compute(n1, {0, 0, 1}), Contains("--net-interference 0"));
  // ZeRO: each of N ranks steps a 1/N shard.
  REQUIRE(predicted_compute(n1, none_for_zero(), 4)[StepPart::optimizer] == 0.25);
}

TEST_CASE("account_from_metrics reads the N = 1 run's account and refuses others",
          "[part_model]") {
  const StepParts a = account_from_metrics(write_metrics("n1", 1, true), "05_ddp_buckets");
  REQUIRE(a[StepPart::backward] == 4);
  REQUIRE(a.total_ms() == Approx(8.25).epsilon(1e-12));
  REQUIRE_THROWS_WITH(account_from_metrics(write_metrics("n1", 1, true), "06_zero1"),
                      Contains("a run of 05_ddp_buckets, not of 06_zero1"));
  REQUIRE_THROWS_WITH(account_from_metrics(write_metrics("n2", 2, true)),
                      Contains("a run at N = 2; give the same chapter's run at N = 1"));
  REQUIRE_THROWS_WITH(account_from_metrics(write_metrics("plain", 1, false)),
                      Contains("run it with --attribute"));
  REQUIRE_THROWS_WITH(account_from_metrics("part_model_test_missing.jsonl"),
                      Contains("cannot read it"));
  const std::string empty = "part_model_test_empty.jsonl";
  std::ofstream(empty) << R"({"type": "step", "step": 1})" << "\n";
  REQUIRE_THROWS_WITH(account_from_metrics(empty), Contains("no summary record"));
  for (const char* f : {"n1", "n2", "plain", "empty"})
    std::remove(("part_model_test_" + std::string(f) + ".jsonl").c_str());
}

TEST_CASE("the comparison: predicted beside rank 0's account", "[part_model]") {
  nlohmann::json attribution = {{"ranks", nlohmann::json::array()}};
  for (int rank : {1, 0}) {  // rank 0 second: found by its number, not its place
    nlohmann::json row = parts_json(parts(2, 4, 1, rank == 0 ? 2.0 : 7.0, 0, 0, 0.5));
    row["rank"] = rank;
    attribution["ranks"].push_back(row);
  }
  const StepParts measured = rank0_account(attribution);
  REQUIRE(measured[StepPart::communication] == 2);
  const StepParts predicted = parts(2, 5, 1, 1, 0, 0, 0.5);
  const std::string table = format_part_comparison(predicted, measured, 1.25, 1.0);
  // Whole rows: name, predicted, measured, ratio ("-": nothing predicted to compare with).
  REQUIRE_THAT(table, Contains("  backward                            5.000      4.000       0.80\n"));
  REQUIRE_THAT(table, Contains("  communication + peer_wait           1.000      2.000       2.00\n"));
  REQUIRE_THAT(table, Contains("  peer_wait                           0.000      0.000          -\n"));
  REQUIRE_THAT(table, Contains("used 1.250, measured 1.000"));
  attribution["ranks"].erase(1);
  REQUIRE_THROWS_WITH(rank0_account(attribution), Contains("without rank 0"));
}
