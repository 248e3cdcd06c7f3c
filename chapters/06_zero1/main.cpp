// Chapter 06: ZeRO-1 — each rank keeps the optimizer state of its shard only.
//
//   mpirun -np 4 build/bin/ch06_zero1 --epochs 5
//   mpirun -np 2 build/bin/ch06_zero1 --model toy --trace zero1.json
//   build/bin/ch06_zero1 --memory-calculator --params 7e9 --world-size 8   # 7B on 8 ranks
//
// Same training as chapter 05, same buckets, same bytes on the wire, bit for bit the same
// numbers. What changes is who updates what: chapter 05's all-reduce is split into its two
// halves (zero.hpp). The reduce-scatter leaves each rank the summed gradient of its shard
// (shard.hpp) of every bucket; each rank's optimizer updates only that shard, so Adam's state
// shrinks to 8Ψ/N per rank; an all-gather then gives every rank the updated parameters.
#include "chapters/06_zero1/step.hpp"
#include "common/driver/run.hpp"

using namespace ringzero;

int main(int argc, char** argv) {
  Run run(argc, argv,
          {.name = "06_zero1",
           .title = "ZeRO-1, optimizer state sharded over ranks, under mpirun",
           .optimizer_state = true,
           .trace = true});
  ZeroBucketFlags flags;  // the lesson is built over --precision's element types (zero.hpp)
  return run.train<Zero1Training>(
      flags,  // train_step is a template (one per precision) over the lesson's engine
      [](auto& lesson, const Step& step) { return train_step(lesson.engine, step); });
}
