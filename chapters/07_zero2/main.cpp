// Chapter 07: ZeRO-2 — each rank keeps the gradients of its shard only, too.
//
//   mpirun -np 4 build/bin/ch07_zero2 --epochs 5
//   mpirun -np 2 build/bin/ch07_zero2 --model toy --bucket-cap-mb 1 --trace zero2.json
//   build/bin/ch07_zero2 --memory-calculator --params 7.5e9 --world-size 64 --mixed-precision
//
// Same training as chapter 06, same collectives, bit for bit the same numbers. What changes
// is what a rank keeps of the gradients (zero.hpp): a bucket's full gradient lives only from
// the backward of its first layer until its reduce-scatter; then this rank copies out its
// chunk into its gradient shard and frees the bucket. The ledger shows gradients of 4Ψ/N per
// rank plus at most two buckets in flight, beside ZeRO-2's formula 4Ψ + (4Ψ + 8Ψ)/N.
#include "chapters/07_zero2/step.hpp"
#include "common/driver/run.hpp"

using namespace ringzero;

int main(int argc, char** argv) {
  Run run(argc, argv,
          {.name = "07_zero2",
           .title = "ZeRO-2, optimizer state and gradients sharded over ranks, under mpirun",
           .optimizer_state = true,
           .trace = true});
  ZeroBucketFlags flags;  // the lesson is built over --precision's element types (zero.hpp)
  return run.train<Zero2Training>(
      flags,  // train_step is a template (one per precision) over the lesson's engine
      [](auto& lesson, const Step& step) { return train_step(lesson.engine, step); });
}
