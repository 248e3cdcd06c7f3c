// Ring all-reduce from point-to-point messages: reduce-scatter, then all-gather.
//
// The buffer of n elements is cut into world_size chunks of s = ceil(n / N) elements; chunk i
// is [i s, (i+1) s) clipped to [0, n), so trailing chunks may be short or empty (n < N, n = 0).
// Rank r owns chunk r. Each phase takes N − 1 steps; in each step every rank sends one chunk
// to rank r + 1 and receives one from rank r − 1 at the same time (sendrecv), so every link
// of the ring is busy and no rank is a bottleneck.
//
//   reduce-scatter, step k: send chunk (r − k − 1), receive chunk (r − k − 2) and add it in.
//     After N − 1 steps, rank r holds the sum over all ranks of chunk r.
//   all-gather, step k:     send chunk (r − k), receive chunk (r − k − 1) and copy it in.
//     After N − 1 steps, every rank holds every reduced chunk.
//
// Each rank sends N − 1 chunks per phase (every chunk but one), (N − 1) s elements when N
// divides n: 2 (N − 1)/N · n elements in all, below 2n whatever N. That is the
// bandwidth-optimal bound (Patarasuk & Yuan 2009; Baidu's ring all-reduce, 2017).
// The sum for chunk c is accumulated in ring order starting at rank c + 1; every rank gets
// bit-identical results because the reduced chunk is copied, not recomputed.
// One template serves float, bf16 and fp16 (common/core/half.hpp) and any communicator with
// Communicator's calls: the hop adds with the element type's own `+=` (add_into: float32 adds;
// bf16/fp16 add in fp32 and round once), on the host or the device the buffers live on.
// Leaves out: pipelining each chunk in segments (adding one while the next is in flight),
// bidirectional rings, the tree and recursive-doubling schedules MPI libraries prefer for
// small messages (latency: the ring takes 2 (N − 1) rounds), and topology awareness.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "common/comm/comm.hpp"
#include "common/core/check.hpp"
#include "common/core/half.hpp"
#include "common/core/ledger.hpp"
#include "common/report/dist.hpp"
#include "common/report/metrics.hpp"

namespace ringzero {

/// Elements [offset, offset + size) of chunk i.
struct Chunk {
  int64_t offset;
  int64_t size;
};

/// Chunk i of n elements split over world_size ranks: chunk size ceil(n / world_size), the
/// last ones clipped (possibly empty). Pure arithmetic, valid for any n >= 0 (also > 2^31).
inline Chunk ring_chunk(int64_t n, int world_size, int i) {
  const int64_t s = (n + world_size - 1) / world_size;
  const int64_t begin = std::min(n, static_cast<int64_t>(i) * s);
  return {begin, std::min(n, begin + s) - begin};
}

inline int ring_mod(int a, int n) {
  return ((a % n) + n) % n;
}

/// Elements rank r sends (and receives) per phase, for the counters' theory: the reduce-scatter
/// sends every chunk but r (and receives every chunk but r − 1), the all-gather sends every
/// chunk but r + 1 (and receives every chunk but r). (N − 1) s when n divides by N.
inline int64_t ring_reduce_scatter_sent(int64_t n, int world_size, int r) {
  return world_size == 1 ? 0 : n - ring_chunk(n, world_size, r).size;
}
inline int64_t ring_reduce_scatter_received(int64_t n, int world_size, int r) {
  return world_size == 1 ? 0 : n - ring_chunk(n, world_size, ring_mod(r - 1, world_size)).size;
}
inline int64_t ring_all_gather_sent(int64_t n, int world_size, int r) {
  return world_size == 1 ? 0 : n - ring_chunk(n, world_size, ring_mod(r + 1, world_size)).size;
}
inline int64_t ring_all_gather_received(int64_t n, int world_size, int r) {
  return world_size == 1 ? 0 : n - ring_chunk(n, world_size, r).size;
}

/// The reduce-scatter phase, in place, for elements of type T (float, bf16, fp16) over any
/// communicator with Communicator's rank, world_size, sendrecv, count_call and Scope; `add` is
/// the hop's accumulate (below; a CUDA kernel in tests/tools/gpu_comm_check.cpp). Afterwards chunk
/// rank() of buf holds the sum over ranks of that chunk; the other chunks hold partial sums
/// (garbage to the caller). Every rank must call with the same n. `scratch` receives the incoming
/// chunk: at least ring_chunk(n, N, 0).size elements (empty: one is allocated here; on the host, so
/// a device communicator passes its own). Traffic per rank: (N − 1) chunks sent, (N − 1) received,
/// of sizeof(T) bytes per element. Errors: scratch shorter than a chunk.
template <class Comm, class T, class Add>
void ring_reduce_scatter(Comm& comm, std::span<T> buf, std::span<T> scratch,
                         [[maybe_unused]] Add add) {  // unused while 04.1 is a stub
  const int N = comm.world_size(), r = comm.rank();
  const auto n = static_cast<int64_t>(buf.size());
  comm.count_call("ring_reduce_scatter");
  if (N == 1) return;
  typename Comm::Scope scope(comm, "ring_reduce_scatter");
  const int64_t s = ring_chunk(n, N, 0).size;
  BufferOf<T> owned;  // a scratch chunk of T (common/core/half.hpp)
  if (scratch.empty()) {
    owned = BufferOf<T>(s, MemTag::comm_buffers);
    scratch = owned.span();
  }
  RZ_CHECK(static_cast<int64_t>(scratch.size()) >= s, "ring_reduce_scatter: scratch has "
                                                          << scratch.size()
                                                          << " elements, the chunk needs " << s);
  // BEGIN EXERCISE 04.1 (ring reduce-scatter)
  for (int k = 0; k < N - 1; ++k) {
    const Chunk send = ring_chunk(n, N, ring_mod(r - k - 1, N));
    const Chunk recv = ring_chunk(n, N, ring_mod(r - k - 2, N));
    comm.sendrecv(std::span<const T>(buf.subspan(send.offset, send.size)), ring_mod(r + 1, N),
                  scratch.first(recv.size), ring_mod(r - 1, N));
    add(buf.subspan(recv.offset, recv.size), std::span<const T>(scratch.first(recv.size)));
  }
  // END EXERCISE 04.1
}

/// The reduce-scatter whose hop adds dst[i] += src[i] in the element type's arithmetic
/// (add_into, common/core/half.hpp): a float32 add for float; for bf16/fp16 the receiver widens
/// both to float32, adds and rounds the sum once, as NCCL's bf16/fp16 reductions do per hop.
template <class T>
void ring_reduce_scatter(Communicator& comm, std::span<T> buf, std::span<T> scratch = {}) {
  ring_reduce_scatter(comm, buf, scratch,
                      [](std::span<T> dst, std::span<const T> src) { add_into(dst, src); });
}

/// The all-gather phase, in place, for elements of type T (it only copies), over any
/// communicator as ring_reduce_scatter: on entry chunk rank() of buf is this rank's; afterwards
/// every chunk holds its owner's values. Traffic per rank: (N − 1) chunks sent, (N − 1) received.
template <class Comm, class T>
void ring_all_gather(Comm& comm, std::span<T> buf) {
  const int N = comm.world_size(), r = comm.rank();
  const auto n = static_cast<int64_t>(buf.size());
  comm.count_call("ring_all_gather");
  if (N == 1) return;
  typename Comm::Scope scope(comm, "ring_all_gather");
  // BEGIN EXERCISE 04.2 (ring all-gather)
  for (int k = 0; k < N - 1; ++k) {
    const Chunk send = ring_chunk(n, N, ring_mod(r - k, N));
    const Chunk recv = ring_chunk(n, N, ring_mod(r - k - 1, N));
    comm.sendrecv(std::span<const T>(buf.subspan(send.offset, send.size)), ring_mod(r + 1, N),
                  buf.subspan(recv.offset, recv.size), ring_mod(r - 1, N));
  }
  // END EXERCISE 04.2
}

/// Sum over ranks, in place, on every rank: reduce-scatter then all-gather (`scratch` as for
/// ring_reduce_scatter). In bf16/fp16 (--reduce-dtype bf16|fp16) half the bytes cross every
/// link, and a chunk's sum is rounded N − 1 times, once per hop, in ring order starting at rank
/// c + 1; an fp32 ring (--reduce-dtype fp32) rounds to fp32 instead. The all-gather copies, so
/// every rank still gets identical bits.
template <class T>
void ring_all_reduce(Communicator& comm, std::span<T> buf, std::span<T> scratch = {}) {
  ring_reduce_scatter(comm, buf, scratch);
  ring_all_gather(comm, buf);
}

/// Sum over ranks in place: our ring (`ring` true; `scratch` as for ring_reduce_scatter) or
/// MPI_Allreduce, the library's algorithm, for float (MPI has no bf16/fp16 sum: the lessons
/// refuse --collectives mpi with a 16-bit --reduce-dtype before training).
template <class T>
void all_reduce(Communicator& comm, std::span<T> buf, std::span<T> scratch, bool ring) {
  if constexpr (std::is_same_v<T, float>) {
    if (!ring) return comm.all_reduce(buf);
  }
  RZ_CHECK(ring, "all_reduce: MPI has no 16-bit sum; use --collectives ring");
  ring_all_reduce(comm, buf, scratch);
}

/// Bytes each rank moves per optimizer step when every parameter (sizes, in elements) is
/// all-reduced on its own, for the end-of-run table: per parameter and phase, every chunk but
/// one; 2(N − 1)/N·Ψ·b in all when the sizes divide by N, whatever N, with b = element_bytes:
/// 4 for an fp32 ring, 2 for a 16-bit one (--reduce-dtype bf16|fp16).
inline TrafficTheory ring_all_reduce_traffic(const std::vector<int64_t>& sizes, int world_size,
                                             int element_bytes = 4) {
  TrafficTheory theory;
  int64_t psi = 0;
  for (int64_t n : sizes) psi += n;
  for (int r = 0; r < world_size; ++r) {
    int64_t sent = 0, received = 0;
    for (int64_t n : sizes) {
      sent += ring_reduce_scatter_sent(n, world_size, r) + ring_all_gather_sent(n, world_size, r);
      received += ring_reduce_scatter_received(n, world_size, r) +
                  ring_all_gather_received(n, world_size, r);
    }
    theory.bytes_sent.push_back(element_bytes * sent);
    theory.bytes_received.push_back(element_bytes * received);
  }
  const std::string b = std::to_string(element_bytes);
  theory.formula =
      "theory (ring all-reduce): every rank sends and receives 2(N-1)/N·Ψ·" + b + " = " +
      human_bytes(2.0 * (world_size - 1) / world_size * psi * element_bytes) +
      " per step, independent of N (exactly: per parameter, every chunk but one, twice); N = " +
      std::to_string(world_size) + ", Ψ = " + std::to_string(psi);
  return theory;
}

}  // namespace ringzero
