// layers_alone: the library's first two layers linked alone. Every object of ringzero_core
// (common/core/) and of ringzero_comm (common/comm/) goes into this program, and nothing else of
// common/ (tests/CMakeLists.txt), so a function of core/ that calls into another folder, or one
// of comm/ that calls past core/, fails this link: the build enforces core <- comm <- the rest
// (common/CMakeLists.txt). scripts/library-shape checks the same direction for the includes.
// Run at N = 2 (ctest layers_alone_np2): each rank computes one gradient of the same model
// (core/) on the same batch and all-reduces it (comm/); the sum must be exactly twice the rank's
// own gradient (2g is exact in float32), element for element. Exit 1 naming the first element
// that differs.
#include <cstdio>
#include <exception>
#include <vector>

#include "common/comm/comm.hpp"
#include "common/core/check.hpp"
#include "common/core/nn.hpp"
#include "common/core/ops.hpp"

int main(int argc, char** argv) {
  using namespace ringzero;
  Communicator comm(argc, argv);
  try {
    RZ_CHECK(comm.world_size() == 2, "layers_alone runs at N = 2, not " << comm.world_size()
                                                                        << "; use mpirun -n 2");
    Model model({8, 16, 4}, /*seed=*/7);  // the same weights on both ranks
    Tensor x = Tensor::zeros({5, 8}, MemTag::activations);
    Tensor y = Tensor::zeros({5, 4}, MemTag::activations);
    for (int64_t i = 0; i < x.numel(); ++i) x.data()[i] = 0.01f * static_cast<float>(i % 13);
    for (int64_t i = 0; i < y.numel(); ++i) y.data()[i] = 0.1f * static_cast<float>(i % 3);
    Tape tape;
    Var loss = mse_loss(tape, model.forward(tape, make_var(x)), y);
    tape.backward(loss);
    std::span<float> grads = model.grads_memory.span();
    const std::vector<float> own(grads.begin(), grads.end());
    comm.all_reduce(grads);
    int64_t nonzero = 0;
    for (size_t i = 0; i < own.size(); ++i) {
      RZ_CHECK(grads[i] == 2.0f * own[i], "gradient element " << i << ": the all-reduced sum is "
                                          << grads[i] << ", not 2 x " << own[i]);
      nonzero += own[i] != 0.0f;
    }
    RZ_CHECK(nonzero > 0, "every gradient element is zero: the test would prove nothing");
    std::printf("layers_alone: rank %d: core/ and comm/ linked alone; %zu gradient elements "
                "(%lld non-zero) all-reduced to exactly 2x\n",
                comm.rank(), own.size(), static_cast<long long>(nonzero));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
