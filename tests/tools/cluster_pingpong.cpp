// cluster_pingpong: per-link latency and bandwidth of an MPI job, for scripts/cluster selftest.
//
//   mpirun -np N cluster_pingpong [--small-bytes 8] [--large-bytes 4194304] [--json FILE]
//
// For every link of the ring (rank i and rank (i + 1) mod N, one pair at a time while the other
// ranks sleep in a barrier) it measures:
//  - latency: the median over 200 round trips of an 8-byte ping-pong, halved (one-way, µs),
//    the best of 10 such medians (other work on a shared machine only ever adds time);
//  - bandwidth: the fastest of 8 round trips of a 4 MiB ping-pong (the same bytes each way),
//    as bytes / (round trip / 2), in bit/s (other work only slows a round trip down; the token
//    bucket's 1 ms of burst can speed one up by at most 3 % at 1 gbit). One-way time of a message
//    of n bytes is α + n/β (Hockney's model); at 4 MiB the α term is under 0.1 % of the time on the
//    links measured, so n / t is β.
// With one rank per node, the ring's links are every node's link in both directions.
// Then, with N > 2, the ring with every link busy at once, as a ring all-reduce uses it: every
// rank sends to rank + 1 and receives from rank − 1 in 2(N − 1) rounds of MPI_Sendrecv of
// large / N bytes (Patarasuk and Yuan's schedule); the slowest rank's time of the 2(N − 1)
// rounds, median of 8, gives β_ring = 2(N − 1)·(large / N) / (time − 2(N − 1)·α) per link, and
// the fabric, N·β_ring: what every link together carries. On an emulated cluster every node's
// packets are processed by the same few cores, so the fabric can be well below N·β (the cost
// model holds operations that use every link at once, the rings, to it).
// Rank 0 prints one line per link and, with --json, writes {"links": [{"a", "b", "latency_us",
// "bandwidth_bps"}, ...], "latency_us": median over links, "bandwidth_bps": median,
// "ring_bandwidth_bps": β_ring, "fabric_bps": N·β_ring (the last two for N > 2 only)}.
// Raw MPI on purpose: it measures the engine the chapters use, with no library code between.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

// A barrier that sleeps while it waits: the ranks not measuring must leave the cores to the two
// that are (MPI_Barrier polls, and on a machine with fewer cores than ranks it would take turns
// with the pair being timed).
static void sleeping_barrier() {
  MPI_Request request;
  MPI_Ibarrier(MPI_COMM_WORLD, &request);
  int done = 0;
  while (MPI_Test(&request, &done, MPI_STATUS_IGNORE), !done) usleep(500);
}

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// One-way times (seconds) of `iters` round trips of `bytes` between ranks a and b (after
// `warmup` untimed ones). Only a and b take part; the others return {}.
static std::vector<double> ping_pong(int rank, int a, int b, size_t bytes, int warmup, int iters) {
  std::vector<char> buf(bytes, 1);
  std::vector<double> times;
  if (rank != a && rank != b) return times;
  const int peer = rank == a ? b : a;
  for (int i = 0; i < warmup + iters; ++i) {
    const double t0 = MPI_Wtime();
    if (rank == a) {
      MPI_Send(buf.data(), static_cast<int>(bytes), MPI_BYTE, peer, 0, MPI_COMM_WORLD);
      MPI_Recv(buf.data(), static_cast<int>(bytes), MPI_BYTE, peer, 0, MPI_COMM_WORLD,
               MPI_STATUS_IGNORE);
    } else {
      MPI_Recv(buf.data(), static_cast<int>(bytes), MPI_BYTE, peer, 0, MPI_COMM_WORLD,
               MPI_STATUS_IGNORE);
      MPI_Send(buf.data(), static_cast<int>(bytes), MPI_BYTE, peer, 0, MPI_COMM_WORLD);
    }
    if (i >= warmup) times.push_back((MPI_Wtime() - t0) / 2);
  }
  return times;
}

// β_ring (bit/s): every rank sends large / n bytes to rank + 1 and receives as many from rank − 1,
// 2(n − 1) rounds (a ring all-reduce's schedule); the slowest rank's time, median of 8 after 2
// untimed; the α of every round (alpha_s, the links' median latency) taken off.
static double ring_bandwidth(int rank, int n, size_t large, double alpha_s) {
  const size_t chunk = large / n;
  std::vector<char> send(chunk, 1), recv(chunk);
  const int right = (rank + 1) % n, left = (rank + n - 1) % n, rounds = 2 * (n - 1);
  std::vector<double> times;
  for (int i = 0; i < 10; ++i) {
    sleeping_barrier();
    const double t0 = MPI_Wtime();
    for (int k = 0; k < rounds; ++k) {
      // Waiting as the chapters' communication threads do (test, then sleep 20 µs: see
      // common/comm/comm_thread.hpp), not spinning: ranks that share a core and spin take it from
      // the kernel work that moves their packets, and the ring would measure the spinning.
      MPI_Request requests[2];
      MPI_Irecv(recv.data(), static_cast<int>(chunk), MPI_BYTE, left, 2, MPI_COMM_WORLD,
                &requests[0]);
      MPI_Isend(send.data(), static_cast<int>(chunk), MPI_BYTE, right, 2, MPI_COMM_WORLD,
                &requests[1]);
      int done = 0;
      while (MPI_Testall(2, requests, &done, MPI_STATUSES_IGNORE), !done) usleep(20);
    }
    double t = MPI_Wtime() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (i >= 2) times.push_back(t);
  }
  const double t = std::max(median(times) - rounds * alpha_s, 1e-9);
  return rounds * static_cast<double>(chunk) * 8.0 / t;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  size_t small = 8, large = 4 << 20;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--small-bytes" && has_value) {
      small = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg == "--large-bytes" && has_value) {
      large = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg == "--json" && has_value) {
      json_path = argv[++i];
    } else {
      if (rank == 0)
        std::fprintf(stderr,
                     "cluster_pingpong: unknown argument '%s'; usage: cluster_pingpong "
                     "[--small-bytes N] [--large-bytes N] [--json FILE]\n",
                     arg.c_str());
      MPI_Finalize();
      return 2;
    }
  }
  if (n < 2 || small == 0 || large == 0 || large > (1u << 30)) {
    if (rank == 0)
      std::fprintf(stderr,
                   "cluster_pingpong: needs at least 2 ranks (got %d) and message sizes in "
                   "[1, 1 GiB] (got %zu and %zu)\n",
                   n, small, large);
    MPI_Finalize();
    return 2;
  }
  // The links of the ring; with N = 2 there is one.
  const int links = n == 2 ? 1 : n;
  std::string json = "{\"links\": [";
  std::vector<double> latencies, bandwidths;
  for (int i = 0; i < links; ++i) {
    const int a = i, b = (i + 1) % n;
    sleeping_barrier();
    double latency = 1e30;  // best of 10 medians: a busy machine's other work cannot lower it
    for (int trial = 0; trial < 10; ++trial) {
      std::vector<double> lat = ping_pong(rank, a, b, small, 20, 200);
      if (!lat.empty()) latency = std::min(latency, median(lat));
    }
    std::vector<double> big = ping_pong(rank, a, b, large, 2, 8);
    sleeping_barrier();  // every rank is out of the timed loops before any result moves
    double result[2] = {0, 0};
    if (rank == a)
      result[0] = latency * 1e6,
      result[1] = large * 8.0 / *std::min_element(big.begin(), big.end());
    // Rank a's figures to rank 0 (a is 0 for the first link; the others send theirs).
    if (a != 0) {
      if (rank == a) MPI_Send(result, 2, MPI_DOUBLE, 0, 1, MPI_COMM_WORLD);
      if (rank == 0) MPI_Recv(result, 2, MPI_DOUBLE, a, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    if (rank == 0) {
      std::printf("link %d <-> %d | latency %8.1f us (%zu B one-way) | bandwidth %7.3f Gbit/s\n", a,
                  b, result[0], small, result[1] / 1e9);
      char entry[200];
      std::snprintf(entry, sizeof entry,
                    "%s{\"a\": %d, \"b\": %d, \"latency_us\": %.3f, \"bandwidth_bps\": %.6e}",
                    i ? ", " : "", a, b, result[0], result[1]);
      json += entry;
      latencies.push_back(result[0]);
      bandwidths.push_back(result[1]);
    }
  }
  double alpha_s = rank == 0 ? median(latencies) * 1e-6 : 0;
  MPI_Bcast(&alpha_s, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  const double ring_bps = n > 2 ? ring_bandwidth(rank, n, large, alpha_s) : 0;
  if (rank == 0) {
    char tail[300];
    std::snprintf(tail, sizeof tail, "], \"latency_us\": %.3f, \"bandwidth_bps\": %.6e%s",
                  median(latencies), median(bandwidths), "");
    json += tail;
    if (n > 2) {
      std::snprintf(tail, sizeof tail, ", \"ring_bandwidth_bps\": %.6e, \"fabric_bps\": %.6e",
                    ring_bps, n * ring_bps);
      json += tail;
    }
    json += "}\n";
    std::printf("median over %d links | latency %.1f us | bandwidth %.3f Gbit/s\n", links,
                median(latencies), median(bandwidths) / 1e9);
    if (n > 2)
      std::printf("ring, every link busy at once (2(N-1) rounds of %zu B) | bandwidth %.3f Gbit/s "
                  "per link | fabric %.3f Gbit/s\n", large / n, ring_bps / 1e9, n * ring_bps / 1e9);
    if (!json_path.empty()) {
      std::ofstream out(json_path);
      out << json;
      if (!out) {
        std::fprintf(stderr, "cluster_pingpong: cannot write %s\n", json_path.c_str());
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
    }
  }
  MPI_Finalize();
  return 0;
}
