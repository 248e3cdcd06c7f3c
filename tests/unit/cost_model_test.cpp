// The cost model (common/report/cost_model.hpp) against the closed forms of Thakur, Rabenseifner
// and Gropp (2005) and Patarasuk and Yuan (2009), on traffic shaped like the chapters' counters:
// the numbers below are exact arithmetic on round inputs (α = 10 µs, β = 1 Gbit/s = 125 bytes
// per µs), so the tolerances are float rounding (1e-9 relative), not modelling slack.
#include <cmath>
#include <cstdio>
#include <fstream>

#include "common/report/cost_model.hpp"

#include <catch2/catch.hpp>

using namespace ringzero;
using Catch::Matchers::Contains;

static const Network kNet{10.0, 1.0};  // α = 10 µs, β = 1 Gbit/s

TEST_CASE("Hockney: a message of n bytes takes alpha + n / beta", "[cost_model]") {
  REQUIRE(kNet.message_ms(0) == Approx(0.010).epsilon(1e-9));
  REQUIRE(kNet.message_ms(125'000) == Approx(0.010 + 1.0).epsilon(1e-9));  // 1 Mbit at 1 Gbit/s
  REQUIRE_THROWS_WITH((Network{10, 0}.message_ms(1)), Contains("--net-bandwidth > 0"));
  REQUIRE_THROWS_WITH((Network{-1, 1}.message_ms(1)), Contains("--net-alpha-us >= 0"));
}

TEST_CASE("the central reducer is serialised on rank 0's link", "[cost_model]") {
  // Chapter 03's counters at N = 4, per step: rank 0 receives 3 gradients (central_reduce) and
  // sends 3 parameter copies (central_broadcast); ranks 1-3 send one and receive one.
  const double psi_bytes = 4.0 * 669706;
  const int N = 4;
  TrafficPerStep t;
  t["central_reduce"] = {{1, 0, 0, 3, 3 * psi_bytes}};
  t["central_broadcast"] = {{1, 3, 3 * psi_bytes, 0, 0}};
  for (int r = 1; r < N; ++r) {
    t["central_reduce"].push_back({1, 1, psi_bytes, 0, 0});
    t["central_broadcast"].push_back({1, 0, 0, 1, psi_bytes});
  }
  const StepPrediction p = predict_step(kNet, t, N, {.compute_ms = 5.0});
  const double loss_ms = 2 * 0.010;  // ceil(log2 4) = 2 rounds of α
  REQUIRE(p.comm_ms == Approx(central_reducer_ms(kNet, N, psi_bytes) + loss_ms).epsilon(1e-9));
  // 2 (N − 1)(α + 4Ψ/β) = 6 (0.01 + 21.43) ms
  REQUIRE(central_reducer_ms(kNet, N, psi_bytes) ==
          Approx(6 * (0.010 + psi_bytes * 8 / 1e6)).epsilon(1e-9));
  REQUIRE(p.predicted_ms == Approx(5.0 + p.comm_ms).epsilon(1e-9));
  REQUIRE(p.serial_ms == p.predicted_ms);
}

// Chapter 04/05's counters for ring all-reduces of `sizes` bytes each at world size N, every
// size divisible by N: per phase and buffer, N − 1 messages of n/N each way, on every rank.
static TrafficPerStep ring_traffic(const std::vector<double>& sizes, int N) {
  TrafficPerStep t;
  for (const char* op : {"ring_reduce_scatter", "ring_all_gather"}) {
    OpTraffic per_rank;
    for (double n : sizes) {
      per_rank.calls += 1;
      per_rank.messages_sent += N - 1;
      per_rank.messages_received += N - 1;
      per_rank.bytes_sent += (N - 1) * n / N;
      per_rank.bytes_received += (N - 1) * n / N;
    }
    t[op].assign(N, per_rank);
  }
  return t;
}

TEST_CASE("the ring all-reduce costs 2(N-1)(alpha + n/(N beta)): N times less than the star",
          "[cost_model]") {
  const double n = 4.0 * 669708;  // divisible by 4
  for (int N : {2, 3, 4, 8}) {
    const double ring = ring_all_reduce_ms(kNet, N, n * N / N);
    REQUIRE(ring == Approx(2 * (N - 1) * (0.010 + n / N * 8 / 1e6)).epsilon(1e-9));
    REQUIRE(ring_phase_ms(kNet, N, n) * 2 == Approx(ring).epsilon(1e-12));
  }
  const int N = 4;
  const StepPrediction p = predict_step(kNet, ring_traffic({n}, N), N, {.compute_ms = 0.0});
  REQUIRE(p.comm_ms == Approx(ring_all_reduce_ms(kNet, N, n) + 0.020).epsilon(1e-9));
  // Bandwidth terms: central 2(N−1) n/β vs ring 2(N−1)/N n/β: ratio N (α aside).
  const double star = central_reducer_ms(kNet, N, n), ring = ring_all_reduce_ms(kNet, N, n);
  REQUIRE(star / ring == Approx(4.0).epsilon(2e-3));  // α terms: 6α on both sides
}

TEST_CASE("buckets: the same bytes in more messages; overlap hides all but the last bucket",
          "[cost_model]") {
  const int N = 4;
  const std::vector<double> buckets(10, 4.0 * 65536);  // 10 buckets of 256 KiB
  const TrafficPerStep t = ring_traffic(buckets, N);
  const StepPrediction serial = predict_step(kNet, t, N, {.compute_ms = 30.0});
  double per_bucket = ring_all_reduce_ms(kNet, N, 4.0 * 65536);
  REQUIRE(serial.comm_ms == Approx(10 * per_bucket + 0.020).epsilon(1e-9));
  REQUIRE(serial.collectives == 0);  // nothing overlaps

  // Compute 30 ms, backward 20 ms of it: communication (~31.5 ms) is longer than backward, so
  // the step is forward 10 + comm − last + last = 10 + comm (the loss all-reduce: after).
  const StepPrediction ddp =
      predict_step(kNet, t, N, {.compute_ms = 30.0, .overlap = Overlap::backward});
  REQUIRE(ddp.serial_ms == Approx(serial.serial_ms).epsilon(1e-12));
  REQUIRE(ddp.collectives == 10);  // 10 buckets, each through both ring phases
  REQUIRE(ddp.predicted_ms == Approx(10.0 + ddp.comm_ms).epsilon(1e-9));
  // Compute 120 ms (backward 80 > comm): the step is compute + the last bucket + the loss
  // all-reduce (2 α, after the step).
  const StepPrediction slow =
      predict_step(kNet, t, N, {.compute_ms = 120.0, .overlap = Overlap::backward});
  REQUIRE(slow.predicted_ms == Approx(120.0 + (slow.comm_ms - 0.020) / 10 + 0.020).epsilon(1e-9));
  // Overlap never costs more than the serial schedule, and never less than its larger part.
  for (double c : {0.0, 1.0, 10.0, 45.0, 200.0})
    for (Overlap o : {Overlap::none, Overlap::backward, Overlap::forward_and_backward}) {
      const StepPrediction q = predict_step(kNet, t, N, {.compute_ms = c, .overlap = o});
      REQUIRE(q.predicted_ms <= q.serial_ms + 1e-12);
      REQUIRE(q.predicted_ms >= std::max(q.compute_ms, q.comm_ms) - 1e-12);
    }
}

TEST_CASE("ZeRO-3: three ring passes per layer, 1.5x DDP's bytes", "[cost_model]") {
  const int N = 4;
  const double layer = 4.0 * 200000;
  TrafficPerStep t = ring_traffic({layer, layer, layer}, N);
  // The backward all-gather: a second ring_all_gather call per layer.
  for (OpTraffic& r : t["ring_all_gather"]) {
    r.calls *= 2, r.messages_sent *= 2, r.messages_received *= 2;
    r.bytes_sent *= 2, r.bytes_received *= 2;
  }
  const StepPrediction p = predict_step(kNet, t, N, {.compute_ms = 0.0});
  REQUIRE(p.comm_ms == Approx(3 * 3 * ring_phase_ms(kNet, N, layer) + 0.020).epsilon(1e-9));
}

TEST_CASE("an unbalanced rank sets the pace; metrics are not steps", "[cost_model]") {
  TrafficPerStep t;
  t["sendrecv"] = {{1, 1, 1000, 1, 1000}, {1, 2, 125000, 1, 1000}};
  t["metrics"] = {{5, 9, 1e9, 9, 1e9}, {5, 9, 1e9, 9, 1e9}};  // ignored
  const StepPrediction p = predict_step(kNet, t, 2, {.compute_ms = 0.0});
  REQUIRE(p.ops_ms.size() == 2);  // sendrecv and the loss all-reduce
  REQUIRE(p.ops_ms[0].second == Approx(2 * 0.010 + 1.0).epsilon(1e-9));
  REQUIRE(p.comm_ms == Approx(2 * 0.010 + 1.0 + 0.010).epsilon(1e-9));
  REQUIRE_THROWS_WITH(predict_step(kNet, t, 2, {.compute_ms = -1.0}), Contains("--net-compute-ms"));
}

TEST_CASE("traffic_per_step reads end_of_run_report's comm entries", "[cost_model]") {
  const nlohmann::json comm = nlohmann::json::parse(R"([
    {"rank": 0, "ops": {"ring_all_gather": {"calls": 20, "messages_sent": 60, "bytes_sent": 6000,
                                            "messages_received": 60, "bytes_received": 6000}}},
    {"rank": 1, "ops": {"ring_all_gather": {"calls": 20, "messages_sent": 60, "bytes_sent": 4000,
                                            "messages_received": 40, "bytes_received": 8000}}}])");
  const TrafficPerStep t = traffic_per_step(comm, 10);
  REQUIRE(t.size() == 1);
  const std::vector<OpTraffic>& v = t.at("ring_all_gather");
  REQUIRE(v.size() == 2);
  REQUIRE(v[0].calls == 2);
  REQUIRE(v[0].messages_sent == 6);
  REQUIRE(v[1].bytes_sent == 400);
  REQUIRE(v[1].messages_received == 4);
  REQUIRE(v[1].bytes_received == 800);
  REQUIRE_THROWS_WITH(traffic_per_step(comm, 0), Contains("no optimizer step"));
}

TEST_CASE("network_from_selftest reads scripts/cluster selftest's medians", "[cost_model]") {
  const std::string path = "cost_model_test_selftest.json";
  std::ofstream(path) << R"({"links": [], "latency_us": 12.5, "bandwidth_bps": 9.9e8})";
  const Network net = network_from_selftest(path);
  REQUIRE(net.alpha_us == 12.5);
  REQUIRE(net.bandwidth_gbps == Approx(0.99).epsilon(1e-12));
  REQUIRE(net.fabric_gbps == 0);  // no ring measured: a non-blocking switch
  // With the ring measurement (every link busy at once): the fabric.
  std::ofstream(path) << R"({"links": [], "latency_us": 12.5, "bandwidth_bps": 9.9e8,
                             "fabric_bps": 3.0e9})";
  REQUIRE(network_from_selftest(path).fabric_gbps == Approx(3.0).epsilon(1e-12));
  REQUIRE(network_from_selftest(path).bandwidth_gbps == Approx(0.99).epsilon(1e-12));
  std::ofstream(path) << R"({"latency_us": 12.5, "bandwidth_bps": 9.9e8, "fabric_bps": -1})";
  REQUIRE_THROWS_WITH(network_from_selftest(path), Contains("fabric_bps is -1"));
  std::remove(path.c_str());
  REQUIRE_THROWS_WITH(network_from_selftest("no/such/file.json"),
                      Contains("scripts/cluster selftest"));
}

TEST_CASE("format_prediction puts the prediction beside the measurement", "[cost_model]") {
  const StepPrediction p =
      predict_step(kNet, ring_traffic({4.0 * 4096}, 4), 4, {.compute_ms = 2.0});
  const std::string s = format_prediction(p, 2 * p.predicted_ms);
  REQUIRE_THAT(s, Contains("measured / predicted 2.00"));
  REQUIRE_THAT(s, Contains("ring_reduce_scatter"));
  REQUIRE(prediction_json(p).at("predicted_ms_per_step").get<double>() == p.predicted_ms);
}

TEST_CASE("ZeRO-1/2: the reduce-scatter overlaps backward, the all-gather follows the step",
          "[cost_model]") {
  const int N = 4;
  const TrafficPerStep t = ring_traffic(std::vector<double>(10, 4.0 * 65536), N);
  const double phase = 10 * ring_phase_ms(kNet, N, 4.0 * 65536);  // one phase, 10 buckets
  const StepPrediction p =
      predict_step(kNet, t, N,
                   {.compute_ms = 120.0,
                    .overlap = Overlap::backward,
                    .overlapped_ops = {"ring_reduce_scatter"}});
  REQUIRE(p.overlapped_comm_ms == Approx(phase).epsilon(1e-9));
  // backward 80 ms hides the reduce-scatter but its last bucket; the all-gather and the loss
  // all-reduce come after.
  REQUIRE(p.predicted_ms == Approx(120.0 + phase / 10 + phase + 0.020).epsilon(1e-9));
}

TEST_CASE("overlap needs a core to spare: with no more cores than ranks, nothing overlaps",
          "[cost_model]") {
  const int N = 4;
  const TrafficPerStep t = ring_traffic(std::vector<double>(10, 4.0 * 65536), N);
  const StepPrediction spare =
      predict_step(kNet, t, N, {.compute_ms = 120.0, .overlap = Overlap::backward, .cores = 8});
  const StepPrediction unknown =
      predict_step(kNet, t, N, {.compute_ms = 120.0, .overlap = Overlap::backward});
  REQUIRE(spare.overlap_possible);
  REQUIRE(unknown.overlap_possible);  // 0 cores: not given, a core to spare assumed
  REQUIRE(spare.predicted_ms == unknown.predicted_ms);
  REQUIRE(spare.predicted_ms < spare.serial_ms);  // the buckets hide behind backward
  // 4 ranks on 2 cores (the emulated cluster on this 2-core machine) or on exactly 4: the
  // communication thread has no core of its own; the step is compute + communication.
  for (int cores : {1, 2, 4}) {
    const StepPrediction none = predict_step(
        kNet, t, N, {.compute_ms = 120.0, .overlap = Overlap::backward, .cores = cores});
    REQUIRE_FALSE(none.overlap_possible);
    REQUIRE(none.predicted_ms == none.serial_ms);
    REQUIRE(none.overlapped_ms == spare.overlapped_ms);  // still reported, as "with a core"
    REQUIRE_THAT(format_prediction(none, 150.0),
                 Contains("not possible: 4 ranks share " + std::to_string(cores) + " cores"));
  }
  REQUIRE_THROWS_WITH(
      predict_step(kNet, t, N, {.compute_ms = 1.0, .overlap = Overlap::backward, .cores = -1}),
                      Contains("--net-cores -1"));
}

TEST_CASE("the two-engine replay: a collective starts when posted and the link is free",
          "[cost_model]") {
  // Backward 20 ms over buckets of 1, 1 and 2 elements (5, 5 and 10 ms of compute each).
  // Short collectives: each ends before the next is posted; the last starts at 20 and ends at 30.
  REQUIRE(replay_backward_buckets(20.0, {1, 1, 2}, {1, 1, 10}) == Approx(30.0).epsilon(1e-12));
  // Long ones queue on the link: 5-15, 15-25, 25-26; backward itself ended at 20.
  REQUIRE(replay_backward_buckets(20.0, {1, 1, 2}, {10, 10, 1}) == Approx(26.0).epsilon(1e-12));
  // Two buckets in flight (ZeRO-2): bucket 2's compute waits for collective 0 (ends 15): 15-25,
  // then its collective 25-26 (the link is free from 25).
  REQUIRE(replay_backward_buckets(20.0, {1, 1, 2}, {10, 10, 1}, 2) ==
          Approx(26.0).epsilon(1e-12));
  // One in flight: each bucket waits for the previous collective: 0-5 c0 5-15; wait 15,
  // compute 15-20, c1 20-30; wait 30, compute 30-40, c2 40-41.
  REQUIRE(replay_backward_buckets(20.0, {1, 1, 2}, {10, 10, 1}, 1) ==
          Approx(41.0).epsilon(1e-12));
  // No communication: the span is backward.
  REQUIRE(replay_backward_buckets(20.0, {1, 3}, {0, 0}) == Approx(20.0).epsilon(1e-12));
  REQUIRE_THROWS_WITH(replay_backward_buckets(20.0, {1, 2}, {1}), Contains("2 sizes but 1"));
  REQUIRE_THROWS_WITH(replay_backward_buckets(20.0, {0, 2}, {1, 1}), Contains("must be > 0"));

  // ZeRO-3, two layers of 1 and 3 elements, forward 4 ms, backward 8 ms, gathers 1 and 2 ms,
  // reduce-scatters 1 and 2 ms. Forward: G0 0-1, (G1 posted at 1) 1-3; fwd0 1-2; wait G1: 3;
  // fwd1 3-6. Backward: G'1 6-8; wait: 8; G'0 8-9; bwd1 8-14; R1 14-16; wait G'0 (9): 14;
  // bwd0 14-16; wait R1: 16; R0 16-17; wait: 17.
  REQUIRE(replay_zero3_prefetch(4.0, 8.0, {1, 3}, {1, 2}, {1, 2}) == Approx(17.0).epsilon(1e-12));
  // Free communication: the span is the compute.
  REQUIRE(replay_zero3_prefetch(4.0, 8.0, {1, 3}, {0, 0}, {0, 0}) == Approx(12.0).epsilon(1e-12));
}

TEST_CASE("the replay: a large bucket ready at the end of backward hides behind nothing",
          "[cost_model]") {
  // The chapters' MLP shape: three small buckets, then one holding 99 % of the elements (the
  // first layer, whose gradient backward writes last). Elements divisible by N = 4.
  const int N = 4;
  const std::vector<double> elements{1000, 1000, 1000, 300000};
  std::vector<double> bytes;
  for (double n : elements) bytes.push_back(4 * n);
  const TrafficPerStep t = ring_traffic(bytes, N);
  const StepPrediction closed =
      predict_step(kNet, t, N, {.compute_ms = 30.0, .overlap = Overlap::backward});
  const StepPrediction replay = predict_step(
      kNet, t, N, {.compute_ms = 30.0, .overlap = Overlap::backward, .sizes = elements});
  REQUIRE_FALSE(closed.replayed);
  REQUIRE(replay.replayed);
  // Each collective's time is its own ring all-reduce (α part per call, β part by size).
  const double last = ring_all_reduce_ms(kNet, N, 4 * 300000);
  const double small = ring_all_reduce_ms(kNet, N, 4 * 1000);
  REQUIRE(replay.comm_ms == Approx(3 * small + last + 0.020).epsilon(1e-9));
  // The small buckets end long before the last is posted at the end of backward (20 ms), so
  // the step is forward 10 + backward 20 + the last bucket + the loss all-reduce (after).
  REQUIRE(3 * small < 20.0 * 3000 / 303000 + 1.0);
  REQUIRE(replay.predicted_ms == Approx(10.0 + 20.0 + last + 0.020).epsilon(1e-9));
  // The closed form takes the mean bucket as the last: far less.
  REQUIRE(closed.predicted_ms < replay.predicted_ms - 10.0);
  // K = 4 micro-batches: only the last one's backward (20/4 = 5 ms) overlaps; the rest of
  // compute (25 ms) is serial. The last bucket is ready at the end of it: 25 + 5 + last.
  const StepPrediction k4 =
      predict_step(kNet, t, N,
                   {.compute_ms = 30.0,
                    .overlap = Overlap::backward,
                    .sizes = elements,
                    .micro_batches = 4});
  REQUIRE(k4.replayed);
  REQUIRE(k4.predicted_ms == Approx(25.0 + 5.0 + last + 0.020).epsilon(1e-9));
  REQUIRE_THROWS_WITH(predict_step(kNet, t, N,
                                   {.compute_ms = 30.0,
                                    .overlap = Overlap::backward,
                                    .sizes = elements,
                                    .micro_batches = 0}),
                      Contains("0 micro-batches"));
  // Sizes that do not match the counters' calls per step: the closed form.
  const StepPrediction mismatch =
      predict_step(kNet, t, N,
                   {.compute_ms = 30.0, .overlap = Overlap::backward, .sizes = {1000, 301000}});
  REQUIRE_FALSE(mismatch.replayed);
  REQUIRE(mismatch.predicted_ms == closed.predicted_ms);
  REQUIRE(prediction_json(replay).at("replayed").get<bool>());
}

TEST_CASE("the replay of ZeRO-3's prefetch: each pass's first gather and the last reduce-scatter show",
          "[cost_model]") {
  const int N = 4;
  const std::vector<double> elements{400000, 200000};  // two layers, divisible by N
  TrafficPerStep t;
  for (const char* op : {"ring_all_gather", "ring_reduce_scatter"}) {
    const double copies = std::string(op) == "ring_all_gather" ? 2 : 1;  // forward and backward
    OpTraffic r;
    for (double n : elements) {
      r.calls += copies;
      r.messages_sent += copies * (N - 1);
      r.messages_received += copies * (N - 1);
      r.bytes_sent += copies * (N - 1) * 4 * n / N;
      r.bytes_received += copies * (N - 1) * 4 * n / N;
    }
    t[op].assign(N, r);
  }
  const double compute = 90.0;
  const StepPrediction p =
      predict_step(kNet, t, N,
                   {.compute_ms = compute,
                    .overlap = Overlap::forward_and_backward,
                    .sizes = elements});
  REQUIRE(p.replayed);
  std::vector<double> g, r;
  for (double n : elements) g.push_back(ring_phase_ms(kNet, N, 4 * n)), r.push_back(g.back());
  REQUIRE(p.predicted_ms ==
          Approx(replay_zero3_prefetch(30.0, 60.0, elements, g, r) + 0.020).epsilon(1e-9));
  // Compute long enough to hide the rest: what shows is forward's first gather (layer 0),
  // backward's first (the last layer, gathered again: chapter 08 does not keep it from
  // forward), the last reduce-scatter (layer 0's) and the loss all-reduce.
  REQUIRE(p.predicted_ms == Approx(g[0] + g[1] + compute + r[0] + 0.020).epsilon(1e-9));
  REQUIRE(p.predicted_ms < p.serial_ms);
}

TEST_CASE("a fabric slower than every link at once holds the ring back, not the star",
          "[cost_model]") {
  const int N = 4;
  const double psi_bytes = 4.0 * 600000;
  // Fabric 2 Gbit/s for 4 links of 1 Gbit/s: with every link busy, each gets 0.5 Gbit/s.
  const Network slow{10.0, 1.0, 2.0};
  const TrafficPerStep ring = ring_traffic({psi_bytes}, N);
  const StepPrediction free_ring = predict_step(kNet, ring, N, {.compute_ms = 0.0});
  const StepPrediction held_ring = predict_step(slow, ring, N, {.compute_ms = 0.0});
  // The β part doubles (every rank's bytes through 2 Gbit/s instead of 4 links of 1); α stays.
  const double alpha = 2 * (N - 1) * 0.010;
  REQUIRE(held_ring.comm_ms - 0.020 - alpha ==
          Approx(2 * (free_ring.comm_ms - 0.020 - alpha)).epsilon(1e-9));
  // The central reducer loads rank 0's link: (N − 1)·n in, the others n each; in all
  // 2(N − 1)·n through the fabric per phase at 2 Gbit/s = (N − 1)·n at 1 Gbit/s: the link's time.
  TrafficPerStep star;
  star["central_reduce"] = {{1, 0, 0, N - 1.0, (N - 1) * psi_bytes},
                            {1, 1, psi_bytes, 0, 0}, {1, 1, psi_bytes, 0, 0}, {1, 1, psi_bytes, 0, 0}};
  const double link_only = predict_step(kNet, star, N, {.compute_ms = 0.0}).comm_ms;
  REQUIRE(predict_step(slow, star, N, {.compute_ms = 0.0}).comm_ms ==
          Approx(link_only).epsilon(1e-9));
  REQUIRE_THROWS_WITH((Network{10, 1, -1}.message_ms(1)), Contains("fabric"));
}
