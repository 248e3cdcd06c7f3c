// Chapter 08: ZeRO-3 — each rank keeps its shard of the parameters only, too.
//
//   mpirun -np 4 build/bin/ch08_zero3 --epochs 5
//   mpirun -np 2 build/bin/ch08_zero3 --model toy --explain-layers --trace zero3.json
//   mpirun -np 2 build/bin/ch08_zero3 --model toy --no-prefetch    # no overlap: wait for each
//
// Same training as chapter 07, the same numbers (bit for bit where the ring sums in the same
// order, layer_shard.hpp). What changes is that no rank holds the whole model (zero3.hpp): a
// layer's parameters are all-gathered before its forward and again before its backward, and
// freed after each; its gradient is reduce-scattered as its backward ends. Model states fall to
// (4 + 4 + 8)Ψ/N per rank; the traffic grows to 3(N−1)/N·4Ψ per step, 1.5× chapter 07's.
#include "chapters/08_zero3/step.hpp"
#include "common/driver/run.hpp"

using namespace ringzero;

int main(int argc, char** argv) {
  Run run(argc, argv,
          {.name = "08_zero3",
           .title = "ZeRO-3, optimizer state, gradients and parameters sharded, under mpirun",
           .optimizer_state = true,
           .trace = true});
  Zero3Flags flags;  // the lesson is built over --precision's element types (zero3.hpp)
  return run.train<Zero3Training>(
      flags,  // train_step is a template (one per precision) over the lesson's engine
      [](auto& lesson, const Step& step) { return train_step(lesson.engine, step); });
}
