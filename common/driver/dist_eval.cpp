#include "common/driver/dist_eval.hpp"

#include <algorithm>

#include "common/core/check.hpp"

namespace ringzero {

std::pair<int64_t, int64_t> eval_range(int64_t test_size, int rank, int world_size) {
  const int64_t batches = (test_size + kEvalBatchSize - 1) / kEvalBatchSize;
  // Rank r takes batches [r B / N, (r+1) B / N): shares differ by at most one batch.
  const int64_t b0 = batches * rank / world_size, b1 = batches * (rank + 1) / world_size;
  return {std::min(test_size, b0 * kEvalBatchSize), std::min(test_size, b1 * kEvalBatchSize)};
}

EvalResult evaluate_distributed(Communicator& comm, Model& model, const Dataset& test) {
  const auto [begin, end] = eval_range(test.size, comm.rank(), comm.world_size());
  return reduce_eval(comm, evaluate(model, test, begin, end), test);
}

EvalResult evaluate_in_lockstep(Communicator& comm, Model& model, const Dataset& test) {
  const auto before = comm.counters();
  const int N = comm.world_size();
  int64_t most = 0;  // the largest share, in batches
  for (int q = 0; q < N; ++q) {
    const auto [b, e] = eval_range(test.size, q, N);
    most = std::max(most, (e - b + kEvalBatchSize - 1) / kEvalBatchSize);
  }
  const auto [begin, end] = eval_range(test.size, comm.rank(), N);
  EvalSums sums;
  for (int64_t i = 0; i < most; ++i) {
    const int64_t s = begin + i * kEvalBatchSize;
    const EvalSums e =
        evaluate(model, test, s < end ? s : 0,
                 s < end ? std::min(end, s + kEvalBatchSize) : std::min(test.size, kEvalBatchSize));
    if (s < end)
      sums.loss_sum += e.loss_sum, sums.correct += e.correct,
          sums.count += e.count;  // else padding: dropped
  }
  comm.recount_as_metrics(before);
  return reduce_eval(comm, sums, test);
}

EvalResult reduce_eval(Communicator& comm, const EvalSums& e, const Dataset& test) {
  // The per-batch loss sums are float * batch size, exact in double; their sum over at most a
  // few dozen batches stays exact too, so the reduction order does not change the result.
  std::vector<double> sums = {e.loss_sum, e.correct, e.count};
  comm.all_reduce_metrics(sums);
  RZ_CHECK(sums[2] == static_cast<double>(test.size), "evaluation counted "
                                                          << sums[2] << " test samples, expected "
                                                          << test.size << "; eval_range is wrong");
  EvalResult out;
  out.test_loss = sums[0] / sums[2];
  if (test.classification()) out.test_accuracy = sums[1] / sums[2];
  return out;
}

double global_mean(Communicator& comm, double local_value) {
  std::vector<double> v = {local_value};
  comm.all_reduce_metrics(v);
  return v[0] / comm.world_size();
}

}  // namespace ringzero
