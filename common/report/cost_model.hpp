// cost_model: what an optimizer step should cost on a network of latency α and per-link
// bandwidth β, from the chapter's own communication counters and the compute time measured at
// N = 1; printed beside the measured step time (docs/cost-model.md derives every formula).
//
// The model, in three parts:
//  - a message of n bytes takes α + n/β (Hockney's α-β model: R. W. Hockney, "The
//    communication challenge for MPP: Intel Paragon and Meiko CS-2", Parallel Computing 20,
//    1994);
//  - every rank has one full-duplex link: it sends one message and receives one at a time, a
//    send and a receive at once (MPI_Sendrecv). An operation (a named counter: central_reduce,
//    ring_reduce_scatter, ...) therefore takes, on its busiest rank, max(messages sent,
//    messages received)·α + max(bytes sent, bytes received)/β, and the step's operations run
//    one after another. Where the fabric (Network::fabric_gbps) cannot carry every link at
//    full rate, the β term is at least the operation's bytes over all ranks / fabric: a ring,
//    which uses every link at once, is held to the fabric; the central reducer, which loads one
//    link, to its link. This gives Thakur, Rabenseifner and Gropp's costs for the schedules the
//    chapters write (Int. J. High Performance Computing Applications 19(1), 2005, §2 and §4):
//    the central reducer 2(N−1)(α + n/β), serialised on rank 0's link; the ring all-reduce
//    2(N−1)(α + n/(Nβ)), bandwidth-optimal (Patarasuk and Yuan, "Bandwidth optimal all-reduce
//    algorithms for clusters of workstations", J. Parallel Distrib. Comput. 69(2), 2009);
//    reduce-scatter or all-gather alone (N−1)(α + n/(Nβ)); ZeRO-3's three passes 3(N−1)(...).
//    The loss all-reduce of every step (MPI_Allreduce of one double) adds ⌈log2 N⌉·α
//    (recursive doubling, Thakur et al. §4.4).
//  - compute: the step time of the same chapter at N = 1 on this rank's share of the batch
//    (no communication). Without overlap, step = compute + communication. With overlap, the
//    overlappable share f of compute (backward: 2/3, its two matrix products per forward one;
//    forward and backward under ZeRO-3's prefetch: 1) can hide communication. Where the chapter
//    names its overlapped collectives' sizes in launch order (CommSchedule::sizes: DDP's and
//    ZeRO-1/2's buckets, ZeRO-3's layers), the step is REPLAYED on two engines, the main thread
//    and the communication thread (replay_backward_buckets, replay_zero3_prefetch): compute
//    advances in proportion to the elements it has processed, each collective starts when it is
//    posted and the link is free, and a wait stops compute until its collective has ended. So a
//    bucket that is ready only at the end of backward (the MLP's first layer: 60 % of Ψ) hides
//    behind nothing, as it does on the wire. Without sizes, the closed form with collectives of
//    equal size: step = (1 − f)·compute + max(f·compute, comm − last) + last + after,
//    comm: the overlapped operations, last = comm / their collectives per step, after: the
//    operations that wait for compute to end (ZeRO-1/2's parameter all-gather).
//    Overlap needs a core to run the communication thread on while compute keeps its own: when
//    the ranks share fewer cores than there are ranks plus one (--net-cores; the emulated
//    cluster puts every node on one machine), the communication thread waits for a time slice
//    at every ring step, and the step is predicted without overlap (docs/cost-model.md).
// With K micro-batches per step (gradient accumulation) only the last one's backward overlaps
// (no_sync): f/K. Leaves out: the replay for ZeRO-3 with K > 1 (it gathers every layer in every
// micro-batch; the closed form is used), ranks that reach a collective at different times,
// contention between flows on a shared link (every schedule here uses each link
// once per direction at a time), TCP's slow start, Open MPI's rendezvous handshake for
// messages above its eager limit (~2α more per message), and MPI's own collectives
// (--collectives mpi): the counters see the payload handed to MPI, not the messages it sends.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/report/step_replay.hpp"

namespace ringzero {

struct StepParts;  // common/core/step_time.hpp

/// A network in Hockney's α-β model: every link the same, joined by a switch whose capacity,
/// the sum over every link at once, may be less than every link at full rate (an
/// oversubscribed fabric; on the emulated cluster, the cores that move every node's packets).
struct Network {
  double alpha_us = 0;        ///< α: one-way latency of a small message, µs (>= 0)
  double bandwidth_gbps = 0;  ///< β: per link and direction, Gbit/s (10^9 bit/s, > 0)
  /// The fabric: Gbit/s per direction summed over every link at once (0: unlimited, a
  /// non-blocking switch). An operation moving B bytes in all takes at least B/fabric.
  double fabric_gbps = 0;
  /// α + bytes/β, in milliseconds. Errors: bandwidth_gbps <= 0 or alpha_us < 0.
  double message_ms(double bytes) const;
};

/// One operation's traffic on one rank per optimizer step (Communicator counters / steps).
struct OpTraffic {
  double calls = 0, messages_sent = 0, bytes_sent = 0, messages_received = 0, bytes_received = 0;
};

/// Per operation name, the traffic of every rank (index = rank).
using TrafficPerStep = std::map<std::string, std::vector<OpTraffic>>;

/// What the step's communication overlaps with (the chapter's schedule).
enum class Overlap {
  none,                  ///< chapters 03, 04, 08 --no-prefetch: communicate, then compute
  backward,              ///< chapters 05-07: buckets all-reduced while backward runs
  forward_and_backward,  ///< chapter 08 with prefetch: the next layer's gather while this one runs
};
/// What a chapter's step overlaps (Lesson::comm_schedule): the kind of overlap and the
/// operations that run during compute (empty: all of them).
struct CommSchedule {
  Overlap overlap = Overlap::none;
  std::vector<std::string> overlapped_ops;
  /// The overlapped collectives' sizes in elements, in the order the step posts them: DDP's
  /// and ZeRO-1/2's buckets in launch order (backward: the last layers' first); ZeRO-3's
  /// layers in forward order. Empty: the closed form with equal collectives (see the top).
  std::vector<double> sizes;
  /// Backward buckets whose memory exists at once (0: every one): ZeRO-2 allocates bucket b
  /// only after bucket b − 2's reduce-scatter has ended (DeepSpeed's double buffer), so the
  /// replay waits for collective c − max_in_flight before computing bucket c.
  int max_in_flight = 0;
  /// Micro-batches per optimizer step (grad_accum_steps, K): with K > 1 only the last
  /// micro-batch's backward overlaps (no_sync), 1/K of the step's backward.
  int64_t micro_batches = 1;
  /// Whether each rank steps only its 1/N shard of the parameters (ZeRO-1/2/3): the optimizer
  /// part of an N = 1 account then shrinks by N (part_model.hpp).
  bool sharded_optimizer = false;
};

/// "none" | "backward" | "forward_and_backward".
const char* overlap_name(Overlap overlap);
/// f: the share of compute that communication can hide (0, 2/3, 1).
double overlappable_fraction(Overlap overlap);

/// The predicted time of one optimizer step and its parts, in milliseconds.
struct StepPrediction {
  double compute_ms = 0;          ///< given: measured at N = 1
  double comm_ms = 0;             ///< Σ over operations, plus the loss all-reduce
  double serial_ms = 0;           ///< compute + comm
  double overlapped_ms = 0;       ///< the overlap formula (equals serial_ms for Overlap::none)
  double predicted_ms = 0;        ///< the chapter's schedule: overlapped_ms
  double overlapped_comm_ms = 0;  ///< the part of comm_ms that runs during compute
  int64_t collectives = 0;        ///< calls per step of the overlapped operations (buckets, layers)
  Overlap overlap = Overlap::none;
  /// Whether a core is free for the communication thread (see the header); when false,
  /// predicted_ms = serial_ms whatever the schedule.
  bool overlap_possible = true;
  int cores = 0;  ///< the cores the ranks share (0: not given, a core to spare assumed)
  int ranks = 1;  ///< world_size
  bool replayed = false;  ///< overlapped_ms from the two-engine replay (else the closed form)
  std::vector<std::pair<std::string, double>> ops_ms;  ///< per operation, plus "loss all-reduce"
};

/// Whether the communication thread has a core while the ranks compute: `cores` (the cores
/// the ranks share; 0: unknown, a core to spare assumed) more than world_size.
bool overlap_possible(int cores, int world_size);

/// Time of one operation per step: max over ranks of max(messages sent, messages received)·α +
/// max(bytes sent, bytes received)/β (see the header). Empty: 0.
double op_time_ms(const Network& net, const std::vector<OpTraffic>& per_rank);

/// What predict_step needs of the step besides its traffic: the compute time and the chapter's
/// schedule (CommSchedule's fields, with --net-compute-ms and --net-cores). The defaults: no
/// compute, nothing overlapped, a core to spare per rank, one micro-batch.
struct StepSchedule {
  /// Compute per step, ms: the step time of the same chapter at N = 1 on this rank's share of
  /// the batch (--net-compute-ms; >= 0).
  double compute_ms = 0;
  Overlap overlap = Overlap::none;  ///< what the step's communication overlaps with
  /// The operations that run during compute (CommSchedule::overlapped_ops; empty: all of them);
  /// the others run after it (ZeRO-1/2's all-gather of the updated parameters follows the
  /// optimizer step). (`= {}`: a designated initializer may leave it out without a warning.)
  std::vector<std::string> overlapped_ops = {};
  /// The CPU cores the ranks share (--net-cores; 0: unknown, every rank assumed to have one to
  /// spare); with cores <= world_size no communication overlaps (overlap_possible false).
  int cores = 0;
  /// CommSchedule::sizes: the overlapped collectives' sizes in elements, in the order the step
  /// posts them (empty: the closed form).
  std::vector<double> sizes = {};
  int max_in_flight = 0;      ///< CommSchedule::max_in_flight: backward buckets at once (0: all)
  int64_t micro_batches = 1;  ///< CommSchedule::micro_batches: K, micro-batches per step (>= 1)
  /// Forward and backward within compute_ms, ms, where they were measured (--net-account: the
  /// N = 1 run's account). Both 0 (the default): not measured, and the overlappable share is
  /// overlappable_fraction()'s (backward 2/3 of compute; ZeRO-3: forward 1/3, backward 2/3, no
  /// optimizer). Measured, the overlap uses them instead, and the rest of compute (optimizer,
  /// copies, other) runs after them, hidden by nothing.
  double forward_ms = 0;
  double backward_ms = 0;
};

/// The step: every operation in `traffic` (except "metrics", the loss and report reductions:
/// modelled as one MPI_Allreduce of a double per step, ⌈log2 N⌉·α) one after another, plus
/// schedule.compute_ms, combined as schedule.overlap says. schedule.overlapped_ops names the
/// operations that run during compute (empty: all of them); the others run after it.
/// schedule.cores: the CPU cores the world_size ranks share (0: unknown); with cores <=
/// world_size no communication overlaps (overlap_possible false). Errors: compute_ms < 0,
/// world_size < 1, cores < 0, the Network's own. schedule.sizes: when the overlapped
/// operations' calls per step match them (one per size; ZeRO-3: two gathers and one
/// reduce-scatter per layer), the step is replayed (see the top; `replayed` true), each
/// collective's time being its operation's α part shared equally and its β part in proportion
/// to its size. micro_batches K > 1 (gradient accumulation): under Overlap::backward only the
/// last micro-batch's backward, f/K of compute, can hide communication. Errors: K < 1.
StepPrediction predict_step(const Network& net, const TrafficPerStep& traffic, int world_size,
                            const StepSchedule& schedule);

/// end_of_run_report's "comm" entries (one per rank: {"rank", "ops": {op: {calls,
/// messages_sent, bytes_sent, messages_received, bytes_received}}}) divided by `steps`.
/// Errors: steps < 1, a missing field.
TrafficPerStep traffic_per_step(const nlohmann::json& comm_per_rank, int64_t steps);

/// Closed forms (Thakur et al. 2005; Patarasuk and Yuan 2009) for `bytes` per rank's buffer, in
/// ms: what predict_step gives for the chapters' schedules, and what the tests check it against.
double central_reducer_ms(const Network& net, int world_size, double bytes);  ///< 2(N−1)(α+n/β)
double ring_all_reduce_ms(const Network& net, int world_size, double bytes);  ///< 2(N−1)(α+n/Nβ)
double ring_phase_ms(const Network& net, int world_size, double bytes);       ///< (N−1)(α+n/Nβ)

/// "network: alpha 12.0 us, beta 1.020 Gbit/s per link[, fabric 3.010 Gbit/s (every link at
/// once)]".
std::string format_network(const Network& net);

/// "predicted 36.1 ms/step (compute 4.0 + communication 32.1 ms, overlap none) | measured
/// 37.5 ms/step (measured / predicted 1.04)" and one line per operation.
std::string format_prediction(const StepPrediction& p, double measured_ms);

/// {"predicted_ms_per_step", "compute_ms", "comm_ms", "serial_ms", "overlap", "ops_ms"}.
nlohmann::json prediction_json(const StepPrediction& p);

/// The network of a `scripts/cluster selftest` JSON file: α = "latency_us" (the median link's
/// one-way latency), β = "bandwidth_bps" (the median link, measured alone), the fabric =
/// "fabric_bps" where present (the ring with every link busy at once: N links × each one's
/// rate; on an emulated cluster the cores that move every node's packets can make it less
/// than N·β). Errors: the file is missing or lacks latency_us / bandwidth_bps, or a field is
/// not a number.
Network network_from_selftest(const std::string& path);

/// The cost model's flags, shared by every distributed chapter: without --net-bandwidth (or
/// --net-selftest) nothing is predicted.
struct NetFlags {
  double alpha_us = 0;        ///< --net-alpha-us: α, µs
  double bandwidth_gbps = 0;  ///< --net-bandwidth: β, Gbit/s per link and direction
  std::string selftest;       ///< --net-selftest: α and β from scripts/cluster selftest's JSON
  double compute_ms = -1;     ///< --net-compute-ms: compute per step at N = 1 (this rank's share)
  int cores = 0;              ///< --net-cores: CPU cores the ranks share (0: one to spare each)
  /// --net-account: the --metrics file of this chapter at N = 1 with --attribute; its account
  /// is the compute, part by part (instead of --net-compute-ms; common/report/part_model.hpp).
  std::string account;
  double interference = 1;  ///< --net-interference: ι, overlapped compute's slow-down (> 0)
  bool enabled() const { return bandwidth_gbps > 0 || !selftest.empty(); }
};
/// Registers --net-alpha-us, --net-bandwidth, --net-selftest, --net-compute-ms, --net-cores,
/// --net-account, --net-interference (group "Cost model").
void add_net_flags(CLI::App& app, NetFlags& flags);

/// At the end of a run, on rank 0: predicts the step from the summary record's "comm" (per
/// rank counters) and "steps", prints format_prediction() beside its "ms_per_step", and returns
/// prediction_json() for the summary ({} when the flags are not given, or on other ranks).
/// With --net-account, the compute is that account's, part by part, and the prediction's
/// "parts" holds the predicted account (part_model.hpp); `account`: that account, read once when
/// the flags were validated (unused without --net-account). Errors: --net-bandwidth without
/// --net-compute-ms or --net-account, and predict_step's.
nlohmann::json report_step_prediction(const NetFlags& flags, const nlohmann::json& summary,
                                      int world_size, const CommSchedule& schedule,
                                      const StepParts& account);

class Extension;
/// The cost model as a feature of every distributed chapter (run.cpp's extensions()): the
/// --net-* flags, checked before set-up, and the prediction printed after the traffic table and
/// written to the summary record as "prediction", with the lesson's comm_schedule().
std::unique_ptr<Extension> cost_model_extension();

}  // namespace ringzero
