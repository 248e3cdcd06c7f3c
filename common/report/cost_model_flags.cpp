// The cost model's flags (--net-*) and the Run extension that prints the prediction at the
// end of a run (common/report/cost_model.hpp).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "common/core/check.hpp"
#include "common/driver/run.hpp"
#include "common/report/cost_model.hpp"
#include "common/report/part_model.hpp"

namespace ringzero {

namespace {
// A finite number > min (strict) or >= min, with the unit in the message (CLI11's own
// PositiveNumber prints its range as 309 digits and lets nan through).
CLI::Validator finite_number(double min, bool strict, const char* unit) {
  return CLI::Validator(
      [=](std::string& v) -> std::string {
        char* end = nullptr;
        const double x = std::strtod(v.c_str(), &end);
        const bool ok =
            end != v.c_str() && *end == '\0' && std::isfinite(x) && (strict ? x > min : x >= min);
        return ok ? std::string()
                  : v + " must be a finite number " + (strict ? "> " : ">= ") +
                        (min == 0 ? "0" : std::to_string(min)) + " (" + unit + ")";
      },
      "NUMBER");
}
}  // namespace

void add_net_flags(CLI::App& app, NetFlags& flags) {
  const std::string group = "Cost model (docs/cost-model.md)";
  app.add_option("--net-alpha-us", flags.alpha_us,
                 "predict the step on a network of this latency per message, us")
      ->check(finite_number(0, false, "microseconds per message"))
      ->group(group);
  app.add_option("--net-bandwidth", flags.bandwidth_gbps,
                 "... and this bandwidth per link and direction, Gbit/s")
      ->check(finite_number(0, true, "Gbit/s per link and direction"))
      ->group(group);
  app.add_option("--net-selftest", flags.selftest,
                 "... or take latency and bandwidth from scripts/cluster selftest's JSON")
      ->check(CLI::Validator(
          [](std::string& v) {
            return v.empty() ? std::string("an empty path; give the selftest's JSON file")
                             : std::string();
          },
          "FILE"))
      ->group(group);
  app.add_option("--net-compute-ms", flags.compute_ms,
                 "compute per step, measured at N = 1 on one rank's share of the batch, ms")
      ->check(finite_number(0, false, "milliseconds per step"))
      ->group(group);
  app.add_option("--net-cores", flags.cores,
                 "CPU cores the ranks share (the emulated cluster: this machine's); with no more "
                 "cores than ranks, nothing overlaps (default 0: a core to spare per rank)")
      ->check(CLI::Validator(
          [](std::string& v) {
            const bool digits = !v.empty() && v.size() <= 6 &&
                                v.find_first_not_of("0123456789") == std::string::npos;
            return digits ? std::string()
                          : "'" + v + "' is not a whole number of cores in [0, 999999]; give "
                                      "e.g. $(nproc), or 0 (a core to spare per rank)";
          },
          "CORES"))
      ->group(group);
  app.add_option("--net-account", flags.account,
                 "... or the compute part by part: the --metrics file of this chapter at N = 1 "
                 "with --attribute (prints the account predicted beside the measured one)")
      ->group(group);
  app.add_option("--net-interference", flags.interference,
                 "how much slower compute runs beside communication, as a factor (the account "
                 "prints the measured one; default 1: not at all)")
      ->check(finite_number(0, true, "a factor, 1: no slow-down"))
      ->group(group);
}

nlohmann::json report_step_prediction(const NetFlags& flags, const nlohmann::json& summary,
                                      int world_size, const CommSchedule& schedule,
                                      const StepParts& account) {
  if (!flags.enabled() || summary.empty()) return {};
  RZ_CHECK(flags.compute_ms >= 0 || !flags.account.empty(),
           "the cost model needs --net-compute-ms: the step time of this chapter at N = 1 on one "
           "rank's share of the batch (scripts/run --cluster measures it)");
  const Network net = flags.selftest.empty() ? Network{flags.alpha_us, flags.bandwidth_gbps}
                                             : network_from_selftest(flags.selftest);
  StepSchedule s{.compute_ms = flags.compute_ms,
                 .overlap = schedule.overlap,
                 .overlapped_ops = schedule.overlapped_ops,
                 .cores = flags.cores,
                 .sizes = schedule.sizes,
                 .max_in_flight = schedule.max_in_flight,
                 .micro_batches = schedule.micro_batches};
  // With --net-account: compute part by part, the overlapped parts slowed by ι.
  StepParts n1, compute;
  const Interference shares =
      interference_for(schedule.overlap, schedule.micro_batches,
                       overlap_possible(flags.cores, world_size), flags.interference);
  if (!flags.account.empty()) {
    n1 = account;
    compute = predicted_compute(n1, shares, schedule.sharded_optimizer ? world_size : 1);
    s.compute_ms = compute.total_ms();
    s.forward_ms = compute[StepPart::forward];
    s.backward_ms = compute[StepPart::backward];
  }
  const StepPrediction p = predict_step(
      net,
      traffic_per_step(summary.at("comm"),
                       summary.value("steps_run", summary.at("steps").get<int64_t>())),
      world_size, s);
  print0(format_network(net));
  print0(format_prediction(p, summary.at("ms_per_step").get<double>()));
  nlohmann::json j = prediction_json(p);
  if (!flags.account.empty()) {
    compute[StepPart::communication] = std::max(0.0, p.predicted_ms - p.compute_ms);
    j["parts"] = {{"n1", parts_json(n1)},
                  {"predicted", parts_json(compute)},
                  {"interference", shares.factor},
                  {"forward_share", shares.forward_share},
                  {"backward_share", shares.backward_share}};
  }
  j["alpha_us"] = net.alpha_us;
  j["bandwidth_gbps"] = net.bandwidth_gbps;
  j["fabric_gbps"] = net.fabric_gbps;
  return j;
}

namespace {
class CostModelExtension : public Extension {
 public:
  void add_flags(CommandLine& cli) override { add_net_flags(cli.app, flags_); }
  void validate(const RunState& state) override {
    const NetFlags& f = flags_;
    RZ_CHECK(!std::isnan(f.bandwidth_gbps) && !std::isnan(f.alpha_us) && !std::isnan(f.compute_ms),
             "--net-bandwidth/--net-alpha-us/--net-compute-ms: nan is not a number; give a "
             "finite value");
    const bool any = f.enabled() || f.alpha_us != 0 || f.compute_ms >= 0 || f.cores != 0 ||
                     !f.account.empty() || f.interference != 1;
    RZ_CHECK(!any || state.chapter.distributed,
             "--net-*: chapter " << state.chapter.name
                                 << " runs on one process, with no communication to predict; the "
                                    "cost model is for chapters 03-08 (docs/cost-model.md). Drop "
                                    "the --net-* flags");
    RZ_CHECK(!any || f.enabled(),
             "--net-alpha-us/--net-compute-ms/--net-cores need --net-bandwidth (or "
             "--net-selftest), as do --net-account and --net-interference: the cost model "
             "predicts nothing without a bandwidth");
    RZ_CHECK(f.interference == 1 || !f.account.empty(),
             "--net-interference " << f.interference
                                   << " without --net-account: it scales the account's "
                                      "forward and backward; give the N = 1 run's account too");
    RZ_CHECK(f.account.empty() || f.compute_ms < 0,
             "--net-account " << f.account
                              << " with --net-compute-ms: give one compute, the account (part "
                                 "by part) or the step time");
    RZ_CHECK(f.selftest.empty() || (f.bandwidth_gbps == 0 && f.alpha_us == 0),
             "--net-selftest " << f.selftest
                               << " with --net-bandwidth/--net-alpha-us: give one network, "
                                  "the selftest's file or the flags");
    if (!flags_.enabled()) return;
    RZ_CHECK(flags_.compute_ms >= 0 || !flags_.account.empty(),
             "--net-bandwidth/--net-selftest need --net-compute-ms (the step time of this chapter "
             "at N = 1 on one rank's share of the batch; scripts/run --cluster measures it) or "
             "--net-account (that run's --metrics file, with --attribute)");
    if (!flags_.selftest.empty()) network_from_selftest(flags_.selftest);  // readable, now
    if (flags_.account.empty()) return;
    RZ_CHECK(state.config.metrics.empty() ||
                 std::filesystem::weakly_canonical(state.config.metrics) !=
                     std::filesystem::weakly_canonical(flags_.account),
             "--net-account " << flags_.account
                              << " is also --metrics: this run would overwrite the account it "
                                 "reads; give --metrics another path");
    account_ = account_from_metrics(flags_.account, state.chapter.name);  // read once, here
  }
  void report(RunState& state, nlohmann::json& summary) override {
    if (!flags_.enabled() || state.comm == nullptr || state.rank != 0) return;
    if (state.step == state.resumed_step) {  // resumed at the last step: no step to predict
      print0("step time: no prediction (no step ran in this process)");
      return;
    }
    CommSchedule schedule = state.lesson->comm_schedule();
    schedule.micro_batches = state.config.grad_accum_steps;
    summary["prediction"] =
        report_step_prediction(flags_, summary, state.world_size, schedule, account_);
  }

 private:
  NetFlags flags_;
  StepParts account_;  // --net-account's, read in validate()
};
}  // namespace

std::unique_ptr<Extension> cost_model_extension() {
  return std::make_unique<CostModelExtension>();
}

}  // namespace ringzero
