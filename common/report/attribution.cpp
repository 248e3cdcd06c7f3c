#include "common/report/attribution.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>

#include "common/comm/comm_queue.hpp"
#include "common/core/check.hpp"
#include "common/driver/run.hpp"

namespace ringzero {

RankDelay parse_rank_delay(const std::string& text) {
  const std::string form = "; give R:MS, a rank and milliseconds, e.g. --delay-rank 1:50";
  const size_t colon = text.find(':');
  RZ_CHECK(colon != std::string::npos, "--delay-rank " << text << ": no ':'" << form);
  const char* begin = text.data();
  const char* end = begin + text.size();
  RankDelay d;
  // std::from_chars reads plain decimal only: no sign, space or hex, and all of each side.
  auto [rank_end, rank_err] = std::from_chars(begin, begin + colon, d.rank);
  RZ_CHECK(rank_err != std::errc::result_out_of_range,
           "--delay-rank " << text << ": rank " << text.substr(0, colon) << " is out of range"
                           << form);
  RZ_CHECK(rank_err == std::errc() && rank_end == begin + colon && d.rank >= 0,
           "--delay-rank " << text << ": rank '" << text.substr(0, colon)
                           << "' is not a decimal rank >= 0" << form);
  auto [ms_end, ms_err] = std::from_chars(begin + colon + 1, end, d.ms);
  RZ_CHECK(ms_err == std::errc() && ms_end == end && std::isfinite(d.ms) && d.ms > 0 &&
               d.ms <= 60000,
           "--delay-rank " << text << ": '" << text.substr(colon + 1)
                           << "' is not a delay in (0, 60000] ms" << form);
  return d;
}

namespace {
// Whether `candidate` waited least of all ranks in at least 3/4 of the steps (true when the
// ranks' step_waits are missing or of different lengths: the means alone decide).
bool late_in_most_steps(const std::vector<RankAccount>& ranks, const RankAccount& candidate) {
  const size_t steps = candidate.step_waits.size();
  for (const RankAccount& a : ranks)
    if (steps == 0 || a.step_waits.size() != steps) return true;
  size_t least = 0;
  for (size_t t = 0; t < steps; ++t) {
    bool is_least = true;
    for (const RankAccount& a : ranks)
      if (&a != &candidate && a.step_waits[t] <= candidate.step_waits[t]) is_least = false;
    least += is_least ? 1 : 0;
  }
  return 4 * least >= 3 * steps;
}
}  // namespace

std::optional<LateRank> find_late_rank(const std::vector<RankAccount>& ranks) {
  if (ranks.size() < 2) return std::nullopt;
  const auto comm = [](const RankAccount& a) {  // all of its waiting: transfer and for peers
    return a.mean[StepPart::communication] + a.mean[StepPart::peer_wait];
  };
  const auto least = std::min_element(ranks.begin(), ranks.end(), [&](const auto& a, const auto& b) {
    return comm(a) < comm(b);
  });
  double others = 0, step = 0;
  for (const RankAccount& a : ranks) {
    if (&a != &*least) others += comm(a);
    step += a.mean.total_ms();
  }
  others /= static_cast<double>(ranks.size() - 1);
  step /= static_cast<double>(ranks.size());
  const double excess = others - comm(*least);
  if (excess <= std::max(1.0, 0.1 * step)) return std::nullopt;
  if (!late_in_most_steps(ranks, *least)) return std::nullopt;
  return LateRank{least->rank, excess};
}

std::string format_account(const std::vector<RankAccount>& ranks,
                           const std::optional<LateRank>& late) {
  std::string out = "step time by part (--attribute), ms per step, mean over " +
                    std::to_string(ranks.empty() ? 0 : ranks[0].steps) +
                    " steps (the first left out):\n  rank";
  char cell[64];
  for (int p = 0; p < kStepParts; ++p) {
    std::snprintf(cell, sizeof cell, " | %13s", step_part_name(static_cast<StepPart>(p)));
    out += cell;
  }
  out += " |      step\n";
  for (const RankAccount& a : ranks) {
    std::snprintf(cell, sizeof cell, "  %4d", a.rank);
    out += cell;
    for (double ms : a.mean.ms) {
      std::snprintf(cell, sizeof cell, " | %13.3f", ms);
      out += cell;
    }
    std::snprintf(cell, sizeof cell, " | %9.3f\n", a.mean.total_ms());
    out += cell;
  }
  if (late) {
    std::snprintf(cell, sizeof cell, "%.3f", late->excess_ms);
    out += "late rank: " + std::to_string(late->rank) + " (the other ranks wait " + cell +
           " ms per step longer in communication and for peers than it does)";
  } else if (ranks.size() > 1) {
    out += "late rank: none (communication per step differs by less than max(1 ms, 10 % of the "
           "step) across ranks)";
  }
  return out;
}

nlohmann::json account_json(const std::vector<RankAccount>& ranks,
                            const std::optional<LateRank>& late) {
  nlohmann::json rows = nlohmann::json::array();
  for (const RankAccount& a : ranks) {
    nlohmann::json row = {{"rank", a.rank}};
    for (int p = 0; p < kStepParts; ++p)
      row[std::string(step_part_name(static_cast<StepPart>(p))) + "_ms"] = a.mean.ms[p];
    row["step_ms"] = a.mean.total_ms();
    rows.push_back(row);
  }
  return {{"steps", ranks.empty() ? 0 : ranks[0].steps},
          {"ranks", rows},
          {"late_rank", late ? nlohmann::json(late->rank) : nlohmann::json(nullptr)},
          {"late_by_ms", late ? late->excess_ms : 0.0}};
}

namespace {

class AttributionExtension : public Extension {
 public:
  void add_flags(CommandLine& cli) override {
    const std::string group = "Step-time attribution (docs/attribution.md)";
    cli.app
        .add_flag("--attribute", on_,
                  "at the end, print each rank's step time split into forward, backward, "
                  "optimizer, communication, waiting for a peer, copies and other, and name the "
                  "rank the others wait for")
        ->group(group);
    cli.app
        .add_flag("--no-overlap", no_overlap_,
                  "wait for every collective where it is queued, so none overlaps the backward "
                  "(a planted cause: chapters 05-08; same numbers, longer step)")
        ->group(group);
    cli.app
        .add_option("--delay-rank", delay_text_,
                    "R:MS: rank R sleeps MS ms at the start of every step (a planted straggler)")
        ->group(group);
  }
  void validate(const RunState& state) override {
    if (delay_text_.empty()) return;
    delay_ = parse_rank_delay(delay_text_);
    RZ_CHECK(state.chapter.distributed,
             "--delay-rank: chapter " << state.chapter.name
                                      << " runs on one process; no rank waits for another. Use "
                                         "it with chapters 03-08");
    RZ_CHECK(delay_.rank < state.world_size,
             "--delay-rank " << delay_text_ << ": rank " << delay_.rank << " does not exist at "
                             << state.world_size << " ranks; give a rank 0.."
                             << state.world_size - 1);
  }
  void after_setup(RunState& state) override {
    RZ_CHECK(!no_overlap_ || CommQueue::created() > 0,
             "--no-overlap: chapter " << state.chapter.name
                                      << " runs every collective on the step's thread; there is "
                                         "no overlap to turn off. Use it with chapters 05-08");
    CommQueue::set_overlap(!no_overlap_);
    StepClock::set_enabled(on_);  // from here on, the driver's clock splits each step, and
                                  // receives wait for their message apart (PeerWaits)
  }
  void before_step(RunState& state) override {
    if (delay_.rank == state.rank)
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(delay_.ms));
  }
  void after_step(RunState& state) override {
    if (!on_ || ++seen_ == 1) return;  // the first step (allocation, warm-up) is left out
    for (int p = 0; p < kStepParts; ++p) sum_.ms[p] += state.last_parts.ms[p];
    step_waits_.push_back(state.last_parts[StepPart::communication] +
                          state.last_parts[StepPart::peer_wait]);
    ++steps_;
  }
  void report(RunState& state, nlohmann::json& summary) override {
    if (!on_) return;
    RankAccount mine{state.rank, steps_, sum_, step_waits_};
    for (double& ms : mine.mean.ms) ms = steps_ > 0 ? ms / static_cast<double>(steps_) : 0;
    std::vector<RankAccount> ranks{mine};
    if (state.comm) {  // every rank's, on rank 0 (a collective: every rank is here)
      const nlohmann::json j = {{"rank", mine.rank},
                                {"steps", mine.steps},
                                {"ms", mine.mean.ms},
                                {"step_waits", mine.step_waits}};
      ranks.clear();
      for (const std::string& s : state.comm->gather_strings(j.dump(), 0)) {
        const nlohmann::json r = nlohmann::json::parse(s);
        RankAccount a{r["rank"].get<int>(), r["steps"].get<int64_t>(), {},
                      r["step_waits"].get<std::vector<double>>()};
        a.mean.ms = r["ms"].get<std::array<double, kStepParts>>();
        ranks.push_back(a);
      }
    }
    if (state.rank != 0) return;
    if (steps_ == 0) {  // every rank ran the same steps
      print0("step time by part (--attribute): no step measured (the first step, warm-up, is "
             "left out); run at least 2 steps");
      summary["attribution"] = {{"steps", 0},
                                {"ranks", nlohmann::json::array()},
                                {"late_rank", nullptr},
                                {"late_by_ms", 0.0}};
      return;
    }
    const std::optional<LateRank> late = find_late_rank(ranks);
    print0(format_account(ranks, late));
    summary["attribution"] = account_json(ranks, late);
  }

 private:
  bool on_ = false;
  bool no_overlap_ = false;
  std::string delay_text_;
  RankDelay delay_;
  int64_t seen_ = 0, steps_ = 0;
  StepParts sum_{};
  std::vector<double> step_waits_;  // communication + peer_wait per measured step
};

}  // namespace

std::unique_ptr<Extension> attribution_extension() {
  return std::make_unique<AttributionExtension>();
}

}  // namespace ringzero
