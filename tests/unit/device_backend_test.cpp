// The device below the tensor (common/core/device_backend.hpp), on the emulated device: its memory
// is out of the host's reach, every op and optimizer update dispatches to its backend and gives
// the host's bits (the backend runs the same host functions on a second mapping), tensors and
// buffers move with their ledger column, and mixing the host and a device is refused.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <type_traits>
#include <vector>

#include "common/comm/mpi_stage.hpp"
#include "common/core/device_backend.hpp"
#include "common/core/nn.hpp"
#include "common/core/ops.hpp"
#include "common/core/optim.hpp"
#include "common/core/rng.hpp"
#include "common/driver/train.hpp"
#include "common/precision/mixed.hpp"
#include "util.hpp"

using namespace ringzero;
using namespace ringzero::test;
using Catch::Matchers::Contains;

namespace {

constexpr Device kEmu = Device::emulated;

// The host copy of a tensor's elements, wherever it lives.
std::vector<float> host_values(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  copy_memory(v.data(), t.data(), t.numel() * 4);
  return v;
}

// Bitwise equality of two tensors' elements (the emulated backend runs the host's code).
void require_same_bits(const Tensor& device, const Tensor& host) {
  const std::vector<float> a = host_values(device), b = host_values(host);
  REQUIRE(a.size() == b.size());
  REQUIRE(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

// A device copy of a host vector, and the host copy of a device array.
template <class T>
BufferOf<T> on_device(const std::vector<T>& host) {
  BufferOf<T> d(std::ssize(host), MemTag::activations, kEmu);
  copy_elements(std::span<const T>(host), d.span());
  return d;
}
template <class Array>
auto back(const Array& device) {
  std::vector<std::remove_const_t<std::remove_pointer_t<decltype(device.data())>>> v(
      static_cast<size_t>(device.size()));
  copy_memory(v.data(), device.data(), device.bytes());
  return v;
}

}  // namespace

TEST_CASE("emulated device memory faults when host code touches it", "[device]") {
  Tensor t = Tensor::zeros({4}, MemTag::activations, kEmu);
  REQUIRE(t.device() == kEmu);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {  // the child writes through the device address, as a missed dispatch would
    signal(SIGSEGV, SIG_DFL);  // not Catch2's handler, which would report it as the test's
    t[0] = 1.0f;
    _exit(0);  // not reached
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFSIGNALED(status));
  REQUIRE(WTERMSIG(status) == SIGSEGV);
}

TEST_CASE("to() moves tensors and buffers, and their bytes between ledger columns", "[device]") {
  const Tensor host = randn({3, 5}, 7);
  const Tensor device = host.to(kEmu, MemTag::activations);
  REQUIRE(device.device() == kEmu);
  REQUIRE(device.data() != host.data());
  require_same_bits(device, host);
  REQUIRE(host.to(Device::cpu, MemTag::activations).data() == host.data());  // already there

  const int64_t host_before = Ledger::get().current(MemTag::gradients);
  const int64_t device_before = Ledger::get().device_current(MemTag::gradients);
  Buffer b(10, MemTag::gradients);
  b.data()[3] = 2.5f;
  b.to(kEmu);
  REQUIRE(b.device() == kEmu);
  REQUIRE(Ledger::get().current(MemTag::gradients) == host_before);
  REQUIRE(Ledger::get().device_current(MemTag::gradients) == device_before + 40);
  b.to(Device::cpu);
  REQUIRE(b.data()[3] == 2.5f);
  REQUIRE(Ledger::get().device_current(MemTag::gradients) == device_before);
}

TEST_CASE("every op on the emulated device gives the host's bits", "[device]") {
  const Tensor inp = randn({6, 4}, 1), weight = randn({3, 4}, 2), bias = randn({3}, 3);
  const Tensor dout = randn({6, 3}, 4);
  auto on = [](const Tensor& t) { return t.to(kEmu, MemTag::activations); };
  Tensor out_h = Tensor::zeros({6, 3}, MemTag::activations);
  Tensor out_d = Tensor::zeros({6, 3}, MemTag::activations, kEmu);
  linear_forward(out_h, inp, weight, bias);
  linear_forward(out_d, on(inp), on(weight), on(bias));
  require_same_bits(out_d, out_h);

  Tensor dinp_h = randn({6, 4}, 5), dw_h = randn({3, 4}, 6), db_h = randn({3}, 8);
  Tensor dinp_d = on(dinp_h), dw_d = on(dw_h), db_d = on(db_h);  // backward accumulates (+=)
  linear_backward(dinp_h, dw_h, db_h, dout, inp, weight);
  linear_backward(dinp_d, dw_d, db_d, on(dout), on(inp), on(weight));
  require_same_bits(dinp_d, dinp_h);
  require_same_bits(dw_d, dw_h);
  require_same_bits(db_d, db_h);

  Tensor r_h = Tensor::zeros({6, 3}, MemTag::activations), r_d = on(r_h);
  relu_forward(r_h, dout);
  relu_forward(r_d, on(dout));
  require_same_bits(r_d, r_h);
  Tensor dr_h = randn({6, 3}, 9), dr_d = on(dr_h);
  relu_backward(dr_h, out_h, r_h);
  relu_backward(dr_d, out_d, r_d);
  require_same_bits(dr_d, dr_h);

  const std::vector<int32_t> labels = {0, 2, 1, 1, 0, 2};
  Tensor p_h = Tensor::zeros({6, 3}, MemTag::activations), p_d = on(p_h);
  const float ce_h = cross_entropy_forward(p_h, out_h, labels);
  REQUIRE(cross_entropy_forward(p_d, out_d, labels) == ce_h);
  require_same_bits(p_d, p_h);
  Tensor dl_h = randn({6, 3}, 10), dl_d = on(dl_h);
  cross_entropy_backward(dl_h, 0.25f, p_h, labels);
  cross_entropy_backward(dl_d, 0.25f, p_d, labels);
  require_same_bits(dl_d, dl_h);

  const float mse_h = mse_forward(out_h, dout);
  REQUIRE(mse_forward(out_d, on(dout)) == mse_h);
  Tensor dp_h = randn({6, 3}, 11), dp_d = on(dp_h);
  mse_backward(dp_h, 0.5f, out_h, dout);
  mse_backward(dp_d, 0.5f, out_d, on(dout));
  require_same_bits(dp_d, dp_h);
}

TEST_CASE("a train step on the emulated device gives the host's bits", "[device]") {
  for (const char* optimizer : {"adamw", "sgd"}) {
    TrainConfig c;
    c.optimizer = optimizer;
    c.momentum = 0.9f;
    Model host({4, 8, 3}, 5), device({4, 8, 3}, 5);
    device.to(kEmu);
    REQUIRE(device.device() == kEmu);
    REQUIRE(device.parameters()[0]->data.device() == kEmu);
    Optimizer opt_h(c, parameter_sizes(host)), opt_d(c, parameter_sizes(device));
    Batch batch;
    batch.x = randn({5, 4}, 12);
    batch.labels = {0, 1, 2, 1, 0};
    for (int step = 0; step < 3; ++step) {
      for (Model* m : {&host, &device}) {
        m->zero_grad();
        Tape tape;
        Var loss = forward_loss(tape, *m, batch);
        REQUIRE(loss->value.device() == Device::cpu);  // a loss is a host scalar
        tape.backward(loss);
        clip_grad_norm(m->grads_memory.span(), 0.1f);  // clips: the norm is above 0.1
        (m == &host ? opt_h : opt_d).step(m->params_memory.span(), m->grads_memory.span());
      }
    }
    INFO(optimizer);
    device.to(Device::cpu);
    REQUIRE(std::memcmp(device.params_memory.data(), host.params_memory.data(),
                        static_cast<size_t>(host.params_memory.bytes())) == 0);
    if (AdamW* a = opt_d.adamw())  // the state followed the parameters to the device
      REQUIRE(device_of(a->exp_avg().data()) == kEmu);
  }
}

TEST_CASE("operands on the host and a device are refused, naming both", "[device]") {
  const Tensor inp = randn({2, 3}, 1), weight = randn({2, 3}, 2), bias = randn({2}, 3);
  Tensor out = Tensor::zeros({2, 2}, MemTag::activations, kEmu);
  REQUIRE_THROWS_WITH(linear_forward(out, inp, weight, bias),
                      Contains("operands on emulated and cpu") && Contains("Tensor::to"));
  REQUIRE_THROWS_WITH(parse_device("gpu"), Contains("--device gpu") && Contains("emulated"));
}

// 16-bit storage on the device: the backend's conversions and norm, and everything
// common/core/half.cpp and common/precision/mixed.cpp build from them, give the host's bits; a
// conversion across the host and the device copies; empty spans (an empty ring chunk, a
// padding-only shard) are nothing.
TEST_CASE("16-bit storage on the emulated device gives the host's bits", "[device]") {
  const int64_t n = 1500;  // three of the host loops' 512-element blocks, the last one partial
  std::vector<float> x(static_cast<size_t>(n)), y(x.size());
  Rng rng(11, 0);
  for (size_t i = 0; i < x.size(); ++i) x[i] = rng.normal() * 300.0f, y[i] = rng.normal();
  x[0] = 70000.0f;        // fp16: inf
  x[1] = 1.0f + 0x1p-8f;  // a bf16 tie
  for (Dtype d : {Dtype::bf16, Dtype::fp16}) {
    INFO(dtype_name(d));
    std::vector<uint16_t> h(x.size()), hy(x.size());
    convert_to_half(d, x, h);
    convert_to_half(d, y, hy);
    Buffer x_d = on_device(x), y_d = on_device(y);
    Buffer16 h_d(n, MemTag::activations, kEmu), hy_d = on_device(hy);
    convert_to_half(d, x_d.span(), h_d.span());
    REQUIRE(back(h_d) == h);
    std::vector<float> across(x.size()), wide(x.size());
    convert_to_float(d, h_d.span(), across);  // device -> host: converted there, copied over
    convert_to_float(d, h, wide);
    REQUIRE(std::memcmp(across.data(), wide.data(), wide.size() * 4) == 0);
    accumulate_half(d, h, std::span<const uint16_t>(hy));  // 16 + 16, then 16 + fp32
    accumulate_half(d, h_d.span(), std::span<const uint16_t>(hy_d.span()));
    accumulate_half(d, h, std::span<const float>(y));
    accumulate_half(d, h_d.span(), std::span<const float>(y_d.span()));
    REQUIRE(back(h_d) == h);
    round_in_place(d, x);
    round_in_place(d, x_d.span());
    REQUIRE(std::memcmp(back(x_d).data(), x.data(), x.size() * 4) == 0);
    REQUIRE(has_non_finite(d, h_d.span()) == has_non_finite(d, h));
    REQUIRE(has_non_finite(d, h_d.span().subspan(1)) == has_non_finite(d, std::span(h).subspan(1)));
    REQUIRE(sum_of_squares_half(d, h_d.span(), 0.25f) == sum_of_squares_half(d, h, 0.25f));
    // The master weights' update on the device: the same masters, moments and 16-bit parameters.
    MasterWeights host(d, y, {1000, 500}), dev(d, y_d.span(), {1000, 500});
    std::vector<uint16_t> p16(y.size());
    Buffer16 p16_d(n, MemTag::activations, kEmu);
    for (int step = 0; step < 3; ++step) {
      host.step(p16, std::span<const uint16_t>(hy), 0.5f);
      dev.step(p16_d.span(), std::span<const uint16_t>(hy_d.span()), 0.5f);
    }
    REQUIRE(back(p16_d) == p16);
    std::vector<float> master(y.size());
    copy_elements(dev.master(), std::span(master));
    REQUIRE(std::memcmp(master.data(), host.master().data(), master.size() * 4) == 0);
    // Empty spans inside a device allocation: nothing happens, on any path.
    std::span<uint16_t> none = h_d.span().subspan(static_cast<size_t>(n));
    convert_to_float(d, std::span<const uint16_t>(none), std::span<float>());
    accumulate_half(d, none, std::span<const uint16_t>(none));
    REQUIRE_FALSE(has_non_finite(d, none));
    REQUIRE(sum_of_squares_half(d, none, 1.0f) == 0.0);
  }
}

TEST_CASE("a staged message goes through the thread's reused staging buffer", "[device]") {
  // comm/mpi_stage.hpp: MPI reaches a device buffer's bytes through host memory that the
  // device's backend allocates (page-locked on CUDA), kept per thread and reused.
  using comm_detail::HostStage;
  BufferOf<float> on_device(1000, MemTag::comm_buffers, Device::emulated);
  std::vector<float> values(1000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f;
  copy_elements(std::span<const float>(values), on_device.span());
  const char* first = nullptr;
  {
    HostStage send(on_device.data(), 4000, /*fill=*/true);  // a sendrecv's two sides at once
    HostStage recv(on_device.data(), 2000, /*fill=*/false);
    first = send.data();
    REQUIRE(device_of(send.data()) == Device::cpu);
    REQUIRE(recv.data() != send.data());
    REQUIRE(std::memcmp(send.data(), values.data(), 4000) == 0);  // filled from the device
    for (int i = 0; i < 500; ++i) recv.floats()[i] = -1.0f * static_cast<float>(i);
    recv.finish();  // the received bytes back to the device
  }
  std::vector<float> back(1000);
  copy_elements(std::span<const float>(on_device.span()), std::span<float>(back));
  CHECK(back[0] == 0.0f);
  CHECK(back[499] == -499.0f);
  CHECK(back[500] == 250.0f);  // beyond the 2000 bytes received: untouched
  HostStage again(on_device.data(), 4000, /*fill=*/false);
  CHECK(again.data() == first);  // the same buffer: no allocation per message
  HostStage host(values.data(), 4000, /*fill=*/true);
  CHECK(host.data() == reinterpret_cast<char*>(values.data()));  // host memory is not staged
}
