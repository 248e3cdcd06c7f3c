// The memory ledger: every Buffer counted under its tag, current and peak bytes, frees and
// moves accounted once. Other tests allocate too, so everything here is measured as a change.
#include <catch2/catch.hpp>

#include "common/core/ledger.hpp"
#include "common/core/tensor.hpp"

using namespace ringzero;

TEST_CASE("ledger counts current and peak bytes per tag", "[ledger]") {
  Ledger& l = Ledger::get();
  const int64_t base = l.current(MemTag::comm_buffers);
  const int64_t base_params = l.current(MemTag::parameters);
  l.reset_peaks();
  REQUIRE(l.peak(MemTag::comm_buffers) == base);
  {
    Buffer a(1000, MemTag::comm_buffers);  // 4000 bytes
    REQUIRE(l.current(MemTag::comm_buffers) == base + 4000);
    REQUIRE(a.bytes() == 4000);
    Buffer moved = std::move(a);  // a move transfers, it does not count twice
    REQUIRE(l.current(MemTag::comm_buffers) == base + 4000);
    REQUIRE(a.size() == 0);
    moved.release();
    REQUIRE(l.current(MemTag::comm_buffers) == base);
    Buffer b(500, MemTag::comm_buffers);
    REQUIRE(l.current(MemTag::comm_buffers) == base + 2000);
    REQUIRE(l.peak(MemTag::comm_buffers) == base + 4000);  // the peak remembers the 1000
  }
  REQUIRE(l.current(MemTag::comm_buffers) == base);
  REQUIRE(l.current(MemTag::parameters) == base_params);  // other tags untouched

  // Model states = parameters + gradients + optimizer_state + padding (ZeRO paper §3).
  const int64_t ms = l.model_states_current();
  {
    Buffer p(10, MemTag::parameters), g(10, MemTag::gradients), o(20, MemTag::optimizer_state),
        pad(3, MemTag::padding), act(100, MemTag::activations);
    REQUIRE(l.model_states_current() == ms + 4 * (10 + 10 + 20 + 3));
    REQUIRE(l.model_states_peak() >= ms + 4 * 43);
  }
  l.reset_peaks();
  REQUIRE(l.peak(MemTag::comm_buffers) == base);
  REQUIRE(std::string(mem_tag_name(MemTag::optimizer_state)) == "optimizer_state");
}

TEST_CASE("owning tensors are counted until their last copy goes", "[ledger]") {
  Ledger& l = Ledger::get();
  const int64_t base = l.current(MemTag::activations);
  Tensor view;
  {
    Tensor t = Tensor::zeros({8, 4}, MemTag::activations);
    REQUIRE(l.current(MemTag::activations) == base + 128);
    view = t;  // a copy shares (and keeps alive) the storage
    REQUIRE(view.shape() == Shape{8, 4});
    REQUIRE(view.data() == t.data());
  }
  REQUIRE(l.current(MemTag::activations) == base + 128);
  view = Tensor();
  REQUIRE(l.current(MemTag::activations) == base);
}
