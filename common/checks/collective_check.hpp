// collective_check: every rank checks, before each collective, that its neighbour is about to
// run the same one (issue 9, item 7).
//
// Chapters 05-08 launch their collectives from hooks on a communication thread (readiness.hpp,
// ddp.hpp, zero.hpp, zero3.hpp, layer_collectives.hpp, through common/comm/comm_queue.hpp). The
// launch order is a rule of the code (buckets in plan order, layers in tape order), not
// something MPI checks: a rank that launches bucket 2 where the others launch
// bucket 0 pairs an all-reduce of one length with one of another (a crash inside MPI, or a
// hang), and a rank that swaps two buckets of equal length exchanges the wrong gradients and
// trains on, silently different. PyTorch's answer is TORCH_DISTRIBUTED_DEBUG=DETAIL: before
// every collective, its ProcessGroupWrapper checks a fingerprint of it (op, sizes, sequence
// number) across ranks and fails naming both sides. This is the same check, at the cost of one
// 16-byte swap with the ring neighbours per collective.
//
// How: before its data, a collective sends its header (sequence number, bucket or layer, kind,
// size) to rank r + 1 and receives rank r - 1's. The swap cannot mismatch itself (the same
// 16 bytes in every collective), and until the first divergence every rank has posted the same
// ones. At the first divergence some rank sees a header unlike its own (if no two neighbours
// differ, none differ) and fails naming both ranks and both collectives; run_main's MPI_Abort
// stops the others. A rank that runs ahead is caught too: its extra collective meets the
// others' next one, whose header differs.
//
// Provides: CollectiveHeader; check_collective (the header swap); CollectiveSequence, the
// numbering and check a communication queue runs (comm_queue.hpp): chapters 05-07's by default,
// on when collective_checks_enabled(), chapter 08's desync check always (layer_desync_check,
// common/zero/layer_check.hpp); collective_check_extension(), the --check-collectives flag
// (environment: RINGZERO_CHECK_COLLECTIVES=1, which the test suite sets).
// Leaves out: the data's contents (two ranks that post the same collectives with different
// values are not caught here; the start-up checks and the equivalence tests are for that).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/comm/comm.hpp"

namespace ringzero {

class Extension;

/// What a collective is, in 16 bytes: the sequence number of this rank's collectives (mod
/// 2^32), what it works on (a bucket or a layer index), its kind (the caller's enumeration) and
/// its number of elements (mod 2^32).
struct CollectiveHeader {
  uint32_t seq = 0, id = 0, kind = 0, size = 0;
  bool operator==(const CollectiveHeader&) const = default;
};

/// Collective, on every rank, right before the collective `mine` describes: swaps headers with
/// the ring neighbours (rank r sends to r + 1, receives from r - 1) and, if rank r - 1's differs,
/// fails with "ranks out of step: <describe(mine)> on this rank, but <describe(left)> on rank
/// <r - 1>. <advice>". The 16 bytes are counted under `op` ("desync_check" in chapter 08, part
/// of its traffic; "metrics" in chapters 05-07, where the check is optional and must not change
/// the traffic the chapter reports). World size 1: nothing to check, no call.
void check_collective(Communicator& comm, const CollectiveHeader& mine,
                      const std::function<std::string(const CollectiveHeader&)>& describe,
                      const std::string& advice, const char* op);

/// Whether chapters 05-07 check their collectives: --check-collectives, or the environment
/// variable RINGZERO_CHECK_COLLECTIVES=1 (read once, at start; the flag, parsed later, wins).
bool collective_checks_enabled();
void set_collective_checks(bool on);

/// A queue's collectives, numbered in launch order, and the check that runs before each
/// (comm_queue.hpp calls next() on the main thread when a collective is queued, check() on the
/// communication thread right before it). By default chapters 05-07's: the buckets' all-reduce,
/// reduce-scatter and all-gather, checked when collective_checks_enabled() and counted as
/// "metrics" (optional, so not the chapter's traffic). Chapter 08 builds its desync check with
/// the second constructor. Each owner numbers its own collectives, the same on every rank.
class CollectiveSequence {
 public:
  enum Kind : uint32_t { kAllReduce, kReduceScatter, kAllGather };
  /// Chapters 05-07's: enabled when collective_checks_enabled() at construction.
  CollectiveSequence();
  /// enabled: check at all; op: what the 16 bytes are counted under; describe: a header in
  /// words (both sides of a mismatch); advice: the message's last sentence, the fix.
  CollectiveSequence(bool enabled, const char* op,
                     std::function<std::string(const CollectiveHeader&)> describe,
                     std::string advice);

  bool enabled() const { return enabled_; }
  /// The header of the next collective: `kind` on unit `unit` (bucket or layer), `size` elements.
  CollectiveHeader next(uint32_t kind, int unit, int64_t size) {
    return {seq_++, static_cast<uint32_t>(unit), kind, static_cast<uint32_t>(size)};
  }
  /// Collective when enabled (see check_collective), else nothing. Errors: "ranks out of step:
  /// collective #3 is the all-reduce of bucket 1 (1049600 elements) on this rank, but ...".
  void check(Communicator& comm, const CollectiveHeader& mine) const {
    if (enabled_) check_collective(comm, mine, describe_, advice_, op_);
  }
  /// "collective #3 is the all-reduce of bucket 1 (1049600 elements)" (chapters 05-07).
  static std::string describe_bucket(const CollectiveHeader& h);

 private:
  bool enabled_;
  const char* op_;
  std::function<std::string(const CollectiveHeader&)> describe_;
  std::string advice_;
  uint32_t seq_ = 0;
};

/// The --check-collectives flag (common/driver/run.cpp registers it for every chapter).
std::unique_ptr<Extension> collective_check_extension();

}  // namespace ringzero
