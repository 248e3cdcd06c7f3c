// Chapter 08: ZeRO-3 — each rank keeps its shard of the parameters only, too.
//
//   mpirun -np 4 build/bin/ch08_zero3 --epochs 5
//   mpirun -np 2 build/bin/ch08_zero3 --model toy --explain-layers --trace zero3.json
//   mpirun -np 2 build/bin/ch08_zero3 --model toy --no-prefetch    # no overlap: wait for each
//
// Same training as chapter 07 (bit for bit where the ring sums in the same order); what changes
// is that no rank holds the whole model: a layer is gathered only to use it (zero3.hpp).
#include "chapters/08_zero3/step.hpp"
#include "common/driver/run.hpp"

using namespace ringzero;

int main(int argc, char** argv) {
  Run run(argc, argv,
          {.name = "08_zero3",
           .title = "ZeRO-3, optimizer state, gradients and parameters sharded, under mpirun",
           .optimizer_state = true,
           .trace = true});
  Zero3Flags flags;
  return run.train<Zero3Training>(
      flags, [](auto& lesson, const Step& step) { return train_step(lesson.engine, step); });
}
