// Chapter 07: ZeRO-2 — each rank keeps the gradients of its shard only, too.
//
//   mpirun -np 4 build/bin/ch07_zero2 --epochs 5
//   mpirun -np 2 build/bin/ch07_zero2 --model toy --bucket-cap-mb 1 --trace zero2.json
//   build/bin/ch07_zero2 --memory-calculator --params 7.5e9 --world-size 64 --mixed-precision
//
// Same training as chapter 06, bit for bit; what changes is what a rank keeps of the
// gradients: its shard, and a bucket only while it is in flight (zero.hpp).
#include "chapters/07_zero2/step.hpp"
#include "common/driver/run.hpp"

using namespace ringzero;

int main(int argc, char** argv) {
  Run run(argc, argv,
          {.name = "07_zero2",
           .title = "ZeRO-2, optimizer state and gradients sharded over ranks, under mpirun",
           .optimizer_state = true,
           .trace = true});
  ZeroBucketFlags flags;
  return run.train<Zero2Training>(
      flags, [](auto& lesson, const Step& step) { return train_step(lesson.engine, step); });
}
