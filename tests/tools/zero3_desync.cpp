// zero3_desync: chapter 08 with one test-only fault, for tests/chapters/ch08_zero3.sh. One rank
// runs a layer once more than the others just before step 2, as a branch on its own data would;
// ZeRO-3's desync check (chapters/08_zero3/layer_collectives.hpp) must stop every rank within
// seconds with a message naming the collective, instead of letting the ranks pair mismatched
// collectives.
//
//   mpirun -np 3 build/bin/zero3_desync --debug-desync-rank 2 --debug-desync-layer 2 ...
//
// The fault is an Extension (common/driver/run.hpp): the chapter itself carries no test machinery.
#include <string>

#include "chapters/08_zero3/step.hpp"
#include "common/driver/run.hpp"

using namespace ringzero;

namespace {

class Desync : public Extension {
 public:
  void add_flags(CommandLine& cli) override {
    cli.app.add_option("--debug-desync-rank", rank_, "this rank runs a layer once more in step 2")
        ->required();
    cli.app.add_option("--debug-desync-layer", layer_, "the layer it runs again (0, 2, ...)")
        ->required();
  }
  // After step 1 and before step 2's first forward: nothing collective runs in between.
  void after_step(RunState& state) override {
    if (state.step != 1 || state.rank != rank_) return;
    for (Linear* layer : state.model->linear_layers())
      if (layer->name() == layer_) {
        Tape tape;  // dropped: a forward only, which gathers the layer on this rank alone
        (*layer)(tape, make_var(Tensor::zeros({1, layer->weight.shape()[1]}, MemTag::activations)));
        return;
      }
    RZ_CHECK(false, "--debug-desync-layer " << layer_
                                            << " is not a Linear layer (0, 2, 4, ... as "
                                               "state_dict names them)");
  }

 private:
  int rank_ = -1;
  std::string layer_;
};

}  // namespace

int main(int argc, char** argv) {
  Run run(argc, argv,
          {.name = "08_zero3",
           .title = "ZeRO-3 with a desynchronised rank (tests only), under mpirun",
           .optimizer_state = true,
           .trace = true});
  run.add_extension(std::make_unique<Desync>());
  Zero3Flags flags;
  return run.train<Zero3Training>(
      flags, [](auto& lesson, const Step& step) { return train_step(lesson.engine, step); });
}
