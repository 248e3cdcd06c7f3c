// The communicator's collectives (comm.hpp declares them): broadcast, all_reduce,
// reduce_scatter, all_gather, barrier, and the reductions of the end-of-run report. Each counts
// its payload (comm.hpp: all_reduce and broadcast the buffer; reduce_scatter and all_gather the
// blocks that leave and reach this rank, as a ring would move them), hands device buffers to the
// device transport (NCCL, device_transport.hpp) or else stages them through host memory
// (HostStage), and splits counts over INT_MAX into several MPI calls.
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <string>
#include <vector>

#include "common/comm/comm.hpp"
#include "common/comm/mpi_stage.hpp"
#include "common/core/check.hpp"
#include "common/core/step_time.hpp"

namespace ringzero {

using comm_detail::HostStage;

void Communicator::broadcast(std::span<float> buf, int root) {
  const PartScope part(StepPart::communication);  // --attribute
  comm_detail::wait_for_peers();  // --attribute: the wait for the last rank apart
  Counters& c = counter("broadcast");
  c.calls += 1;
  const auto size = static_cast<int64_t>(buf.size());
  (rank_ == root ? c.bytes_sent : c.bytes_received) += size * 4;
  if (DeviceTransport* t = transport_for({{buf.data(), size}}))
    return t->broadcast(buf.data(), size, root);
  HostStage stage(buf.data(), size * 4, /*fill=*/rank_ == root);
  for (auto [off, n] : split_count(size))
    MPI_CALL(MPI_Bcast(stage.floats() + off, static_cast<int>(n), MPI_FLOAT, root, MPI_COMM_WORLD));
  stage.finish();
}

void Communicator::all_reduce(std::span<float> buf) {
  const PartScope part(StepPart::communication);  // --attribute
  comm_detail::wait_for_peers();  // --attribute: the wait for the last rank apart
  Counters& c = counter("all_reduce");
  c.calls += 1;
  const auto size = static_cast<int64_t>(buf.size());
  c.bytes_sent += size * 4;
  c.bytes_received += size * 4;
  if (DeviceTransport* t = transport_for({{buf.data(), size}}))
    return t->all_reduce(buf.data(), size);
  HostStage stage(buf.data(), size * 4, /*fill=*/true);
  for (auto [off, n] : split_count(size))
    MPI_CALL(MPI_Allreduce(MPI_IN_PLACE, stage.floats() + off, static_cast<int>(n), MPI_FLOAT,
                           MPI_SUM, MPI_COMM_WORLD));
  stage.finish();
}

void Communicator::reduce_scatter(std::span<const float> in, std::span<float> out) {
  const PartScope part(StepPart::communication);  // --attribute
  comm_detail::wait_for_peers();  // --attribute: the wait for the last rank apart
  const auto s = static_cast<int64_t>(out.size());
  RZ_CHECK(static_cast<int64_t>(in.size()) == s * world_size_,
           "reduce_scatter: input " << in.size() << " != world_size " << world_size_ << " x output "
                                    << s);
  Counters& c = counter("reduce_scatter");
  c.calls += 1;
  c.bytes_sent += (s * (world_size_ - 1)) * 4;
  c.bytes_received += s * 4;
  if (DeviceTransport* t = transport_for({{in.data(), s * world_size_}, {out.data(), s}}))
    return t->reduce_scatter(in.data(), out.data(), s);
  HostStage in_stage(in.data(), s * world_size_ * 4, /*fill=*/true);
  HostStage out_stage(out.data(), s * 4, /*fill=*/false);
  const float* input = in_stage.floats();
  float* output = out_stage.floats();
  if (s * world_size_ <= INT_MAX) {
    MPI_CALL(MPI_Reduce_scatter_block(input, output, static_cast<int>(s), MPI_FLOAT, MPI_SUM,
                                      MPI_COMM_WORLD));
  } else {  // too large for one call: block r is reduced to rank r, in pieces
    for (int r = 0; r < world_size_; ++r)
      for (auto [off, n] : split_count(s))
        MPI_CALL(MPI_Reduce(input + r * s + off, output + off, static_cast<int>(n), MPI_FLOAT,
                            MPI_SUM, r, MPI_COMM_WORLD));
  }
  out_stage.finish();
}

void Communicator::all_gather(std::span<const float> in, std::span<float> out) {
  const PartScope part(StepPart::communication);  // --attribute
  comm_detail::wait_for_peers();  // --attribute: the wait for the last rank apart
  const auto s = static_cast<int64_t>(in.size());
  RZ_CHECK(
      static_cast<int64_t>(out.size()) == s * world_size_,
      "all_gather: output " << out.size() << " != world_size " << world_size_ << " x input " << s);
  Counters& c = counter("all_gather");
  c.calls += 1;
  c.bytes_sent += s * 4;
  c.bytes_received += s * (world_size_ - 1) * 4;
  if (DeviceTransport* t = transport_for({{in.data(), s}, {out.data(), s * world_size_}}))
    return t->all_gather(in.data(), out.data(), s);
  HostStage in_stage(in.data(), s * 4, /*fill=*/true);
  HostStage out_stage(out.data(), s * world_size_ * 4, /*fill=*/false);
  const float* input = in_stage.floats();
  float* output = out_stage.floats();
  if (s * world_size_ <= INT_MAX) {
    MPI_CALL(MPI_Allgather(input, static_cast<int>(s), MPI_FLOAT, output, static_cast<int>(s),
                           MPI_FLOAT, MPI_COMM_WORLD));
  } else {  // too large for one call: each rank broadcasts its block, in pieces
    std::copy(input, input + s, output + rank_ * s);
    for (int r = 0; r < world_size_; ++r)
      for (auto [off, n] : split_count(s))
        MPI_CALL(
            MPI_Bcast(output + r * s + off, static_cast<int>(n), MPI_FLOAT, r, MPI_COMM_WORLD));
  }
  out_stage.finish();
}

void Communicator::barrier() {
  const PartScope part(StepPart::peer_wait);  // --attribute: a barrier is waiting for peers
  counter("barrier").calls += 1;
  MPI_CALL(MPI_Barrier(MPI_COMM_WORLD));
}

void Communicator::all_reduce_metrics(std::span<double> values) {
  const PartScope part(StepPart::communication);  // --attribute
  comm_detail::wait_for_peers();  // --attribute: the wait for the last rank apart
  Counters& c = counters_["metrics"];
  c.calls += 1;
  c.bytes_sent += static_cast<int64_t>(values.size()) * 8;
  c.bytes_received += static_cast<int64_t>(values.size()) * 8;
  MPI_CALL(MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_DOUBLE,
                         MPI_SUM, MPI_COMM_WORLD));
}

void Communicator::broadcast_string(std::string& s, int root) {
  const PartScope part(StepPart::communication);  // --attribute
  counters_["metrics"].calls += 1;
  int64_t len = static_cast<int64_t>(s.size());
  MPI_CALL(MPI_Bcast(&len, 1, MPI_INT64_T, root, MPI_COMM_WORLD));
  s.resize(static_cast<size_t>(len));
  for (auto [off, n] : split_count(len))
    MPI_CALL(MPI_Bcast(s.data() + off, static_cast<int>(n), MPI_CHAR, root, MPI_COMM_WORLD));
}

std::vector<std::string> Communicator::gather_strings(const std::string& s, int root) {
  const PartScope part(StepPart::communication);  // --attribute
  counters_["metrics"].calls += 1;
  int len = static_cast<int>(s.size());
  std::vector<int> lens(static_cast<size_t>(world_size_));
  MPI_CALL(MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, root, MPI_COMM_WORLD));
  std::vector<int> displs(lens.size(), 0);
  int total = 0;
  for (size_t r = 0; r < lens.size(); ++r) {
    displs[r] = total;
    total += lens[r];
  }
  std::string all(rank_ == root ? static_cast<size_t>(total) : 0, '\0');
  MPI_CALL(MPI_Gatherv(s.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR,
                       root, MPI_COMM_WORLD));
  std::vector<std::string> out;
  if (rank_ == root)
    for (size_t r = 0; r < lens.size(); ++r)
      out.push_back(all.substr(static_cast<size_t>(displs[r]), static_cast<size_t>(lens[r])));
  return out;
}

}  // namespace ringzero
