#include "common/report/step_replay.hpp"

#include <cmath>

#include "common/core/check.hpp"

namespace ringzero {

namespace {
void check_sizes(const std::vector<double>& sizes, size_t n, const char* what) {
  RZ_CHECK(sizes.size() == n, what << ": " << sizes.size() << " sizes but " << n << " times");
  for (double v : sizes)
    RZ_CHECK(v > 0 && std::isfinite(v), what << ": a collective of " << v << " elements; sizes "
                                             << "must be > 0");
}
}  // namespace

int TwoEngineReplay::post(double ms) {
  const double start = std::max(now_, link_free_);
  link_free_ = start + ms;
  ends_.push_back(link_free_);
  return static_cast<int>(ends_.size()) - 1;
}

void TwoEngineReplay::wait(int id) {
  RZ_CHECK(id >= 0 && id < static_cast<int>(ends_.size()), "replay: no collective " << id);
  now_ = std::max(now_, ends_[static_cast<size_t>(id)]);
}

double replay_backward_buckets(double backward_ms, const std::vector<double>& sizes,
                               const std::vector<double>& comm_ms, int max_in_flight) {
  check_sizes(sizes, comm_ms.size(), "replay_backward_buckets");
  double total = 0;
  for (double n : sizes) total += n;
  TwoEngineReplay r;
  for (size_t c = 0; c < sizes.size(); ++c) {
    if (max_in_flight > 0 && c >= static_cast<size_t>(max_in_flight))
      r.wait(static_cast<int>(c) - max_in_flight);  // its memory is freed for this bucket
    r.compute(backward_ms * sizes[c] / total);  // the bucket's gradients are written...
    r.post(comm_ms[c]);                         // ... and its collective is launched
  }
  r.wait_all();  // finalize_backward: every bucket's collective has ended
  return r.now();
}

double replay_zero3_prefetch(double forward_ms, double backward_ms,
                             const std::vector<double>& sizes,
                             const std::vector<double>& gather_ms,
                             const std::vector<double>& reduce_scatter_ms) {
  check_sizes(sizes, gather_ms.size(), "replay_zero3_prefetch (gathers)");
  check_sizes(sizes, reduce_scatter_ms.size(), "replay_zero3_prefetch (reduce-scatters)");
  const int L = static_cast<int>(sizes.size());
  double total = 0;
  for (double n : sizes) total += n;
  TwoEngineReplay r;
  std::vector<int> gathered(static_cast<size_t>(L), -1);
  auto gather = [&](int l) {
    if (gathered[static_cast<size_t>(l)] < 0)
      gathered[static_cast<size_t>(l)] = r.post(gather_ms[static_cast<size_t>(l)]);
    return gathered[static_cast<size_t>(l)];
  };
  for (int l = 0; l < L; ++l) {  // pre_forward: wait for l, post l + 1; compute
    r.wait(gather(l));
    if (l + 1 < L) gather(l + 1);
    r.compute(forward_ms * sizes[static_cast<size_t>(l)] / total);
  }
  std::fill(gathered.begin(), gathered.end(), -1);  // released after forward: gathered again
  int pending = -1;                                 // the later layer's reduce-scatter
  for (int l = L - 1; l >= 0; --l) {
    r.wait(gather(l));  // pre_backward: wait for l, post l − 1; compute
    if (l > 0) gather(l - 1);
    r.compute(backward_ms * sizes[static_cast<size_t>(l)] / total);
    if (pending >= 0) r.wait(pending);  // post_backward: the later layer's, then this one's
    pending = r.post(reduce_scatter_ms[static_cast<size_t>(l)]);
  }
  r.wait(pending);
  return r.now();
}

}  // namespace ringzero
