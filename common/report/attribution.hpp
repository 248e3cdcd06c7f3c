// attribution: where did my step go? Per rank, the optimizer step's wall-clock time split into
// forward, backward, optimizer, communication (the time the step's thread spent in a collective
// or waiting on the communication queue: what the backward did not hide), peer_wait (the part
// of that spent before a peer had sent what this rank receives) and other, from the clock
// every step runs under (common/core/step_time.hpp); and which rank the others wait for.
//
// Provides: --attribute (the table at the end of the run and "attribution" in the summary
// record of --metrics), --delay-rank R:MS (a planted straggler: rank R sleeps MS ms at the start
// of every step), and the pieces they are made of, for tests: RankDelay and parse_rank_delay,
// RankAccount, find_late_rank, format_account, account_json.
// A late rank shows in everyone else's communication: each waits in its collectives for the
// rank that arrives last, which itself waits least. So the late rank is the one with the least
// communication and peer_wait per step, when the others wait more than a threshold longer
// (find_late_rank).
// Leaves out: the account's prediction (common/report/part_model.hpp, --net-account).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/core/step_time.hpp"

namespace ringzero {

class Extension;

/// --delay-rank R:MS: rank R sleeps MS milliseconds at the start of every optimizer step.
struct RankDelay {
  int rank = -1;  ///< -1: none
  double ms = 0;
};

/// Parses "R:MS": R a decimal rank >= 0, MS decimal milliseconds in (0, 60000]. Errors
/// (RZ_CHECK, naming the text and the form): anything else, signs, spaces and hex included.
RankDelay parse_rank_delay(const std::string& text);

/// One rank's mean step over the steps it measured (the first step, warm-up, left out).
struct RankAccount {
  int rank = 0;
  int64_t steps = 0;  ///< steps averaged
  StepParts mean;     ///< ms per step, per part; their sum is the mean step
  /// communication + peer_wait of each step averaged, ms (empty: not known; find_late_rank then
  /// judges by the means alone).
  std::vector<double> step_waits = {};
};

/// The rank the others wait for, and by how much.
struct LateRank {
  int rank = -1;
  double excess_ms = 0;  ///< the others' mean communication + peer_wait minus its, ms per step
};

/// The rank with the least communication + peer_wait per step, when the other ranks' mean
/// exceeds its own by more than max(1 ms, 10 % of the mean step): every collective makes the
/// others wait for it. Where every rank has its step_waits (the same steps), it must also have
/// waited least in at least 3/4 of the steps: a straggler is late every step; a rank that was
/// descheduled now and then on a shared machine, which can move the means, is not.
/// std::nullopt on one rank, below the threshold, or late too rarely.
std::optional<LateRank> find_late_rank(const std::vector<RankAccount>& ranks);

/// The table: one row per rank (ms per step, per part, and their sum), then the late rank.
std::string format_account(const std::vector<RankAccount>& ranks,
                           const std::optional<LateRank>& late);

/// {"steps", "ranks": [{"rank", "<part>_ms"..., "step_ms"}], "late_rank" (null: none),
/// "late_by_ms"}: the summary record's "attribution".
nlohmann::json account_json(const std::vector<RankAccount>& ranks,
                            const std::optional<LateRank>& late);

/// --attribute and --delay-rank, registered in the driver's extensions() (run.cpp).
std::unique_ptr<Extension> attribution_extension();

}  // namespace ringzero
