// step_replay: one optimizer step replayed on two engines, the main thread and the
// communication thread, to see how much communication hides behind compute (the cost model's
// overlap, common/report/cost_model.hpp; docs/cost-model.md derives it). Times in ms throughout.
#pragma once

#include <algorithm>
#include <vector>

namespace ringzero {

/// The step replayed on two engines: the main thread (compute, posts, waits) and one
/// communication thread that runs posted collectives one at a time, in order (CommThread's
/// FIFO). Times in ms. compute(ms) advances the main thread; post(ms) queues a collective of
/// that duration and returns its id: it starts when the main thread posts it and the previous
/// one has ended; wait(id) holds the main thread until that collective has ended.
class TwoEngineReplay {
 public:
  void compute(double ms) { now_ += ms; }
  int post(double ms);
  void wait(int id);
  void wait_all() { now_ = std::max(now_, link_free_); }
  double now() const { return now_; }  ///< the main thread's clock

 private:
  double now_ = 0, link_free_ = 0;
  std::vector<double> ends_;
};

/// DDP / ZeRO-1 / ZeRO-2 backward (chapters 05-07): backward_ms of compute in proportion to
/// sizes[c]; collective c (comm_ms[c]) posted when its elements are done; then every
/// collective waited for. max_in_flight > 0: before bucket c's compute, collective
/// c − max_in_flight is waited for (its memory is reused). Returns the backward's span, from
/// its start to the last end. Errors: sizes and comm_ms of different lengths, a size <= 0.
double replay_backward_buckets(double backward_ms, const std::vector<double>& sizes,
                               const std::vector<double>& comm_ms, int max_in_flight = 0);

/// ZeRO-3 with prefetch (chapter 08's hooks, in order): per layer l (forward order, sizes[l]
/// elements) the forward gather G_l is waited for, G_{l+1} posted, forward_ms·share_l
/// computed; in backward (last layer first) G'_l waited for (posted at once for the last
/// layer), G'_{l−1} posted, backward_ms·share_l computed, the later layer's reduce-scatter
/// waited for, R_l posted; the last one waited for. gather_ms[l] / reduce_scatter_ms[l]: one
/// gather / reduce-scatter of layer l. Returns the span of forward and backward.
/// Errors: lengths that differ, a size <= 0.
double replay_zero3_prefetch(double forward_ms, double backward_ms,
                             const std::vector<double>& sizes,
                             const std::vector<double>& gather_ms,
                             const std::vector<double>& reduce_scatter_ms);

}  // namespace ringzero
