// Chapter 06: ZeRO-1 — each rank keeps the optimizer state of its shard only.
//
//   mpirun -np 4 build/bin/ch06_zero1 --epochs 5
//   mpirun -np 2 build/bin/ch06_zero1 --model toy --trace zero1.json
//   build/bin/ch06_zero1 --memory-calculator --params 7e9 --world-size 8   # 7B on 8 ranks
//
// Same training as chapter 05, bit for bit; what changes is who updates what: each rank its
// shard, then the all-gather (zero.hpp).
#include "chapters/06_zero1/step.hpp"
#include "common/driver/run.hpp"

using namespace ringzero;

int main(int argc, char** argv) {
  Run run(argc, argv,
          {.name = "06_zero1",
           .title = "ZeRO-1, optimizer state sharded over ranks, under mpirun",
           .optimizer_state = true,
           .trace = true});
  ZeroBucketFlags flags;
  return run.train<Zero1Training>(
      flags, [](auto& lesson, const Step& step) { return train_step(lesson.engine, step); });
}
