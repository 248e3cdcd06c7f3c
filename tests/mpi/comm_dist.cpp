// common/report/dist under mpirun, np 1..4: the evaluation split counts every test sample exactly
// once and gives exactly the single-process numbers; each rank's micro-batches tile the global
// batch in rank-major order; the start-up check passes when every rank built the same model;
// the end-of-run report's summary fields equal the counters.
#include <set>
#include <vector>

#include "common/core/rng.hpp"
#include "common/driver/dist_config.hpp"
#include "common/driver/dist_eval.hpp"
#include "common/driver/train.hpp"
#include "common/report/dist.hpp"
#include "mpi/test_comm.hpp"

#include <catch2/catch.hpp>

using namespace ringzero;

TEST_CASE("eval_range: whole evaluation batches, every sample once", "[dist]") {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{499}, int64_t{500}, int64_t{1234},
                    int64_t{10000}, int64_t{10001}})
    for (int N = 1; N <= 7; ++N) {
      INFO("n = " << n << ", N = " << N);
      int64_t next = 0, largest = 0, smallest = n;
      for (int r = 0; r < N; ++r) {
        auto [b, e] = eval_range(n, r, N);
        REQUIRE(b == next);  // contiguous, in rank order: the ranges tile [0, n)
        REQUIRE(e >= b);
        REQUIRE((b % kEvalBatchSize == 0 || b == n));  // batches start where one process's do
        largest = std::max(largest, e - b);
        smallest = std::min(smallest, e - b);
        next = e;
      }
      REQUIRE(next == n);
      REQUIRE(largest - smallest <= kEvalBatchSize);  // balanced to within one batch
    }
}

TEST_CASE("evaluate_distributed equals single-process evaluate exactly", "[dist]") {
  Communicator& comm = test_comm();
  // A classification set whose size divides neither by 500 nor by 3.
  Dataset test;
  test.size = 1234;
  test.in_features = 8;
  test.num_classes = test.out_features = 3;
  test.inputs = Buffer(test.size * test.in_features, MemTag::dataset);
  Rng rng(7, 0);
  for (float& x : test.inputs.span()) x = rng.normal();
  for (int64_t i = 0; i < test.size; ++i) test.labels.push_back(static_cast<int32_t>(i % 3));
  Model model({8, 16, 3}, /*seed=*/5);
  const EvalResult dist = evaluate_distributed(comm, model, test);
  const EvalSums one = evaluate(model, test, 0, test.size);  // every rank, the whole set
  REQUIRE(dist.test_accuracy == one.correct / one.count);
  REQUIRE(dist.test_loss == one.loss_sum / one.count);
  REQUIRE(dist.test_accuracy > 0.0);
}

TEST_CASE("rank_micro_batch: ranks and micro-steps tile the global batch in order", "[dist]") {
  const int64_t B = 24;
  Sampler sampler(100, B, /*seed=*/1, /*shuffle=*/true);
  sampler.set_epoch(2);
  for (int N = 1; N <= 4; ++N)
    for (int64_t K : {1, 2, 3}) {
      if (B % (N * K) != 0) continue;
      std::vector<int64_t> seen;
      for (int r = 0; r < N; ++r)
        for (int64_t k = 0; k < K; ++k)
          for (int64_t i : rank_micro_batch(sampler, 3, r, N, K, k)) seen.push_back(i);
      auto global = sampler.global_batch(3);
      REQUIRE(seen == std::vector<int64_t>(global.begin(), global.end()));
    }
}

TEST_CASE("start-up check passes for identical models; report fields match counters", "[dist]") {
  Communicator& comm = test_comm();
  Model model({5, 4, 3}, /*seed=*/11);
  comm.reset_counters();
  broadcast_and_verify_parameters(comm, model);  // would abort the test run on a mismatch
  const nlohmann::json startup = finish_setup(comm);
  REQUIRE(startup.at("broadcast").at("calls") == 1);
  REQUIRE(comm.counters().empty());
  std::vector<float> data(10, 1.0f);
  for (int step = 0; step < 3; ++step) comm.all_reduce(data);
  TrafficTheory theory;
  theory.formula = "test";
  const nlohmann::json s = end_of_run_report(comm, 3, startup, "test", theory);
  if (comm.rank() == 0) {
    REQUIRE(s.at("bytes_sent_per_rank_per_step") == 40.0);
    REQUIRE(s.at("comm").size() == static_cast<size_t>(comm.world_size()));
    REQUIRE(s.at("ledger").size() == static_cast<size_t>(comm.world_size()));
    REQUIRE(s.at("comm")[0].at("training").at("bytes_sent") == 120);
  } else {
    REQUIRE(s.is_null());
  }
  comm.reset_counters();
}
