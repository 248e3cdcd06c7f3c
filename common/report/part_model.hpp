// part_model: the cost model part by part. What each column of the step account (--attribute:
// forward, backward, optimizer, communication, peer_wait, copies, other) should cost at N ranks,
// from the same chapter's account at N = 1 and the α-β prediction of its communication
// (common/report/cost_model.hpp), printed beside the measured account (docs/attribution.md).
//
// The prediction, part by part:
//  - forward, backward: the N = 1 account's, times the interference factor ι where they run
//    while communication does (backward under DDP's and ZeRO-1/2's buckets, the last of K
//    micro-batches only; forward and backward under ZeRO-3's prefetch) and the communication
//    thread has a core (cost_model.hpp, overlap_possible). Two threads that share a memory bus
//    or a core slow each other; ι = 1 says they do not (--net-interference; its default);
//  - optimizer: the N = 1 account's, over N where each rank steps a 1/N shard (ZeRO-1/2/3,
//    CommSchedule::sharded_optimizer);
//  - copies, other: the N = 1 account's (ZeRO-3's shard copies change with N; not modelled).
//    Its communication and peer_wait, one rank's collectives, are left out: the network model
//    predicts the communication at N;
//  - communication: what predict_step's step exceeds its compute by, the communication the
//    schedule does not hide, with that compute's forward and backward measured rather than
//    overlappable_fraction()'s 2/3 rule;
//  - peer_wait: 0. The model has every rank reach a collective together; what a run measures
//    here is skew or a straggler, so the comparison also shows communication + peer_wait.
// The measured interference inverts the first rule on the run's own account: the ι that would
// have predicted its forward and backward exactly. Give it as --net-interference to the next run
// (scripts/cluster-tour calibrates it on chapter 05 so).
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

#include "common/core/step_time.hpp"
#include "common/report/cost_model.hpp"

namespace ringzero {

class Extension;

/// The account a prediction part by part starts from: rank 0's mean ms per step and part in the
/// summary record of the same chapter run at N = 1 with `--attribute --metrics FILE`. Errors
/// (naming the file and the fix): unreadable, no summary record, no "attribution" in it, no step
/// measured, more than one rank (a run at N > 1), or another chapter's run than `chapter`
/// (the summary's "chapter"; empty: not checked).
StepParts account_from_metrics(const std::string& path, const std::string& chapter = "");

/// Where communication runs beside compute, and how much of it (--net-interference).
struct Interference {
  double factor = 1;  ///< ι: the overlapped compute at N over the same compute at N = 1 (> 0)
  /// The share of forward and of backward that runs beside communication, in [0, 1]: backward
  /// 1/K under Overlap::backward; forward and backward 1 under ZeRO-3's prefetch; 0 where
  /// nothing overlaps or the communication thread has no core of its own.
  double forward_share = 0, backward_share = 0;
};

/// The shares of Interference for a schedule: overlap and micro-batches K (CommSchedule), and
/// whether a core is free for the communication thread (overlap_possible).
Interference interference_for(Overlap overlap, int64_t micro_batches, bool possible,
                              double factor);

/// The compute parts at N (see the top): n1's forward and backward, each times
/// 1 − share + share·ι; optimizer n1's over `optimizer_shards` (N for ZeRO, else 1); copies and
/// other n1's; communication and peer_wait 0. Errors: ι <= 0 or not finite, optimizer_shards < 1.
StepParts predicted_compute(const StepParts& n1, const Interference& interference,
                            int optimizer_shards = 1);

/// The ι that turns n1's overlapped forward + backward into `measured`'s (the inverse of
/// predicted_compute's rule). 0 where no part overlaps or n1's overlapped parts are 0.
double measured_interference(const StepParts& n1, const StepParts& measured,
                             const Interference& interference);

/// Rank 0's parts in an "attribution" record (attribution.hpp, account_json): the rank the
/// model predicts, which runs every part (chapter 03's central reducer steps on rank 0 alone).
/// Errors: no rank 0.
StepParts rank0_account(const nlohmann::json& attribution);

/// The table, in ms per step: one row per part and for communication + peer_wait and the step,
/// predicted, measured (rank 0's) and measured / predicted ("-" where predicted is
/// 0), then the interference used and measured.
std::string format_part_comparison(const StepParts& predicted, const StepParts& measured,
                                   double factor_used, double factor_measured);

/// {"<part>_ms": ms, ..., "step_ms"}: a StepParts as the summary record writes it.
nlohmann::json parts_json(const StepParts& parts);
/// The inverse of parts_json. Errors: a missing part.
StepParts parts_from_json(const nlohmann::json& j);

/// Prints, after the account, the prediction part by part beside it: the cost model writes its
/// predicted parts into the summary's "prediction" (with --net-account), --attribute writes the
/// measured ones into "attribution"; this compares the two on rank 0 and adds "measured" and
/// "measured_interference" to the prediction's "parts". Registered after both (run.cpp).
std::unique_ptr<Extension> part_comparison_extension();

}  // namespace ringzero
