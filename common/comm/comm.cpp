#include "common/comm/comm.hpp"

#include <mpi.h>

#include <vector>

#include "common/comm/mpi_stage.hpp"
#include "common/core/check.hpp"
#include "common/core/device_memory.hpp"
#include "common/core/step_time.hpp"

namespace ringzero {

using comm_detail::complete;
using comm_detail::HostStage;
using comm_detail::wait_for_message;

std::vector<std::pair<int64_t, int64_t>> split_count(int64_t n, int64_t max_piece) {
  RZ_CHECK(n >= 0 && max_piece > 0, "split_count(" << n << ", " << max_piece << ")");
  std::vector<std::pair<int64_t, int64_t>> pieces;
  for (int64_t off = 0; off < n; off += max_piece)
    pieces.emplace_back(off, std::min(max_piece, n - off));
  return pieces;
}

Communicator::Communicator(int& argc, char**& argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
  set_rank_context(rank_, world_size_);
  MPI_Comm node;
  MPI_CALL(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
  MPI_Comm_rank(node, &local_rank_);
  MPI_Comm_free(&node);
  RZ_CHECK(provided >= MPI_THREAD_SERIALIZED,
           "this MPI provides thread level " << provided
                                             << ", RingZero needs MPI_THREAD_SERIALIZED or better");
}

Communicator::~Communicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

Communicator::Counters& Communicator::counter(const char* op) {
  return counters_[scope_.empty() ? op : scope_];
}

TransportFactory& nccl_transport_factory() {
  static TransportFactory factory = nullptr;
  return factory;
}

DeviceTransport* Communicator::transport_for(
    std::initializer_list<std::pair<const void*, int64_t>> buffers) const {
  if (transport_ == nullptr) return nullptr;
  bool any = false;
  for (auto [data, bytes] : buffers) {
    if (bytes == 0) continue;  // an empty side's pointer may lie anywhere
    if (device_of(data) != transport_->device()) return nullptr;
    any = true;
  }
  return any ? transport_ : nullptr;
}

namespace {

// Counts a point-to-point call's messages as MPI moves them, `sent` and `received` elements of
// elem_bytes: one message per INT_MAX piece (split_count) each way.
void count_messages(Communicator::Counters& c, int64_t sent, int64_t received, int elem_bytes) {
  for (auto [off, k] : split_count(sent)) c.messages_sent += 1, c.bytes_sent += k * elem_bytes;
  for (auto [off, k] : split_count(received))
    c.messages_received += 1, c.bytes_received += k * elem_bytes;
}

}  // namespace

Communicator::Counters Communicator::recount_as_metrics(
    const std::map<std::string, Counters>& snapshot) {
  Counters moved;
  for (auto op = counters_.begin(); op != counters_.end();) {
    if (op->first == "metrics") {
      ++op;
      continue;
    }
    auto it = snapshot.find(op->first);
    const Counters before = it == snapshot.end() ? Counters{} : it->second;
    moved.add(op->second).add(before, -1);
    if (it == snapshot.end()) {
      op = counters_.erase(op);  // an operation only the moved traffic used
    } else {
      op->second = before;
      ++op;
    }
  }
  counters_["metrics"].add(moved);
  return moved;
}

Communicator::Counters Communicator::training_traffic() const {
  Counters sum;
  for (const auto& [op, c] : counters_)
    if (op != "metrics") sum.add(c);
  return sum;
}

void Communicator::send(std::span<const float> buf, int dest) {
  send_raw(buf.data(), static_cast<int64_t>(buf.size()), dest, /*elem_bytes=*/4);
}

void Communicator::send(std::span<const uint16_t> buf, int dest) {
  send_raw(buf.data(), static_cast<int64_t>(buf.size()), dest, /*elem_bytes=*/2);
}

void Communicator::recv(std::span<float> buf, int src) {
  recv_raw(buf.data(), static_cast<int64_t>(buf.size()), src, /*elem_bytes=*/4);
}

void Communicator::recv(std::span<uint16_t> buf, int src) {
  recv_raw(buf.data(), static_cast<int64_t>(buf.size()), src, /*elem_bytes=*/2);
}

void Communicator::send_raw(const void* data, int64_t size, int dest, int elem_bytes) {
  const PartScope part(StepPart::communication);  // --attribute
  const MPI_Datatype type = elem_bytes == 4 ? MPI_FLOAT : MPI_UINT16_T;
  Counters& c = counter("send");
  if (scope_.empty()) c.calls += 1;
  count_messages(c, size, 0, elem_bytes);
  if (DeviceTransport* t = transport_for({{data, size}}))
    return t->sendrecv(data, size * elem_bytes, dest, nullptr, 0, dest);
  HostStage stage(data, size * elem_bytes, /*fill=*/true);
  const char* bytes = stage.data();
  for (auto [off, n] : split_count(size))
    MPI_CALL(
        MPI_Send(bytes + off * elem_bytes, static_cast<int>(n), type, dest, 0, MPI_COMM_WORLD));
}

void Communicator::recv_raw(void* data, int64_t size, int src, int elem_bytes) {
  const PartScope part(StepPart::communication);  // --attribute
  const MPI_Datatype type = elem_bytes == 4 ? MPI_FLOAT : MPI_UINT16_T;
  Counters& c = counter("recv");
  if (scope_.empty()) c.calls += 1;
  count_messages(c, 0, size, elem_bytes);
  if (DeviceTransport* t = transport_for({{data, size}}))
    return t->sendrecv(nullptr, 0, src, data, size * elem_bytes, src);
  HostStage stage(data, size * elem_bytes, /*fill=*/false);
  char* bytes = stage.data();
  if (PeerWaits::enabled() && size > 0) wait_for_message(src);  // --attribute (step_time.hpp)
  for (auto [off, n] : split_count(size))
    MPI_CALL(MPI_Recv(bytes + off * elem_bytes, static_cast<int>(n), type, src, 0, MPI_COMM_WORLD,
                      MPI_STATUS_IGNORE));
  stage.finish();
}

void Communicator::sendrecv(std::span<const float> send_buf, int dest, std::span<float> recv_buf,
                            int src) {
  sendrecv_raw(send_buf.data(), static_cast<int64_t>(send_buf.size()), dest, recv_buf.data(),
               static_cast<int64_t>(recv_buf.size()), src, /*elem_bytes=*/4);
}

void Communicator::sendrecv(std::span<const uint16_t> send_buf, int dest,
                            std::span<uint16_t> recv_buf, int src) {
  sendrecv_raw(send_buf.data(), static_cast<int64_t>(send_buf.size()), dest, recv_buf.data(),
               static_cast<int64_t>(recv_buf.size()), src, /*elem_bytes=*/2);
}

void Communicator::sendrecv_raw(const void* send_data, int64_t send_n, int dest, void* recv_data,
                                int64_t recv_n, int src, int elem_bytes) {
  const PartScope part(StepPart::communication);  // --attribute
  const MPI_Datatype type = elem_bytes == 4 ? MPI_FLOAT : MPI_UINT16_T;
  Counters& c = counter("sendrecv");
  if (scope_.empty()) c.calls += 1;
  count_messages(c, send_n, recv_n, elem_bytes);
  if (DeviceTransport* t = transport_for({{send_data, send_n}, {recv_data, recv_n}}))
    return t->sendrecv(send_data, send_n * elem_bytes, dest, recv_data, recv_n * elem_bytes, src);
  HostStage send_stage(send_data, send_n * elem_bytes, /*fill=*/true);
  HostStage recv_stage(recv_data, recv_n * elem_bytes, /*fill=*/false);
  const char* send_bytes = send_stage.data();
  char* recv_bytes = recv_stage.data();
  // Each direction is cut into pieces on its own: the sender's send length is the receiver's
  // receive length, so both ends of a link agree on the number of messages, and an empty side
  // sends (or expects) none. (Splitting both by max(send, receive) breaks that when a rank's two
  // sides differ, e.g. a ring with empty chunks: a stray empty message then truncates the next.)
  // Everything is posted before any wait and completed together, so a ring cannot deadlock.
  std::vector<MPI_Request> requests;
  auto post_receives = [&] {
    for (auto [off, n] : split_count(recv_n)) {
      requests.emplace_back();
      MPI_CALL(MPI_Irecv(recv_bytes + off * elem_bytes, static_cast<int>(n), type, src, 0,
                         MPI_COMM_WORLD, &requests.back()));
    }
  };
  auto post_sends = [&] {
    for (auto [off, n] : split_count(send_n)) {
      requests.emplace_back();
      MPI_CALL(MPI_Isend(send_bytes + off * elem_bytes, static_cast<int>(n), type, dest, 0,
                         MPI_COMM_WORLD, &requests.back()));
    }
  };
  if (PeerWaits::enabled() && recv_n > 0) {  // --attribute: the wait for src apart (step_time)
    post_sends();
    try {
      wait_for_message(src);
    } catch (...) {
      comm_detail::cancel_requests(requests);  // stopping at an error: nothing stays posted
      throw;
    }
    post_receives();
  } else {
    post_receives();
    post_sends();
  }
  complete(requests, dest, src);
  recv_stage.finish();
}

}  // namespace ringzero
