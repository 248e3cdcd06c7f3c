#include "common/gpu/staged_comm.hpp"

#include <span>

#include "common/check.hpp"
#include "common/gpu/device.hpp"
#include "common/ledger.hpp"

namespace ringzero {

namespace {
void d2h(float* dst, const float* src, int64_t n) {
  if (n > 0) copy_to_host(dst, src, n * 4);
}
void h2d(float* dst, const float* src, int64_t n) {
  if (n > 0) copy_to_device(dst, src, n * 4);
}
std::span<float> span(float* p, int64_t n) {
  return {p, static_cast<size_t>(n)};
}
}  // namespace

StagedCommunicator::~StagedCommunicator() {
  if (host_) pinned_free(host_, host_size_ * 4, MemTag::comm_buffers);
}

float* StagedCommunicator::host(int64_t n) {
  if (n > host_size_) {
    if (host_) pinned_free(host_, host_size_ * 4, MemTag::comm_buffers);
    host_ = nullptr;
    host_ = static_cast<float*>(pinned_alloc(n * 4, MemTag::comm_buffers));
    host_size_ = n;
  }
  return host_;
}

void StagedCommunicator::send(const float* buf, int64_t n, int dest) {
  const int mark = begin_span(nullptr);
  float* h = host(n);
  d2h(h, buf, n);
  comm_.send(span(h, n), dest);
  end_span("send", mark, nullptr);
}

void StagedCommunicator::recv(float* buf, int64_t n, int src) {
  const int mark = begin_span(nullptr);
  float* h = host(n);
  comm_.recv(span(h, n), src);
  h2d(buf, h, n);
  end_span("recv", mark, nullptr);
}

void StagedCommunicator::sendrecv(const float* send_buf, int64_t n_send, int dest, float* recv_buf,
                                  int64_t n_recv, int src) {
  const int mark = begin_span(nullptr);
  float* h = host(n_send + n_recv);
  d2h(h, send_buf, n_send);
  comm_.sendrecv(span(h, n_send), dest, span(h + n_send, n_recv), src);
  h2d(recv_buf, h + n_send, n_recv);
  end_span("sendrecv", mark, nullptr);
}

void StagedCommunicator::all_reduce(float* buf, int64_t n) {
  const int mark = begin_span(nullptr);
  float* h = host(n);
  d2h(h, buf, n);
  comm_.all_reduce(span(h, n));
  h2d(buf, h, n);
  end_span("all_reduce", mark, nullptr);
}

void StagedCommunicator::reduce_scatter(const float* in, float* out, int64_t n) {
  const int mark = begin_span(nullptr);
  const int64_t total = n * comm_.world_size();
  float* h = host(total + n);
  d2h(h, in, total);
  comm_.reduce_scatter(span(h, total), span(h + total, n));
  h2d(out, h + total, n);
  end_span("reduce_scatter", mark, nullptr);
}

void StagedCommunicator::all_gather(const float* in, float* out, int64_t n) {
  const int mark = begin_span(nullptr);
  const int64_t total = n * comm_.world_size();
  float* h = host(total + n);
  d2h(h, in, n);
  comm_.all_gather(span(h, n), span(h + n, total));
  h2d(out, h + n, total);
  end_span("all_gather", mark, nullptr);
}

void StagedCommunicator::broadcast(float* buf, int64_t n, int root) {
  const int mark = begin_span(nullptr);
  float* h = host(n);
  if (comm_.rank() == root) d2h(h, buf, n);
  comm_.broadcast(span(h, n), root);
  h2d(buf, h, n);
  end_span("broadcast", mark, nullptr);
}

}  // namespace ringzero
