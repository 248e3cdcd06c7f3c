// Chapter 05: DDP — gradient buckets all-reduced during backward, and no_sync.
//
//   mpirun -np 4 build/bin/ch05_ddp_buckets --epochs 5
//   mpirun -np 2 build/bin/ch05_ddp_buckets --model toy --explain-buckets --trace ddp.json
//   mpirun -np 4 build/bin/ch05_ddp_buckets --grad-accum-steps 4   # sends in micro-step 4 only
//
// Same training as chapter 04, same ring, same traffic; what changes is when the gradients
// travel: bucket by bucket during backward (ddp.hpp).
#include "chapters/05_ddp_buckets/step.hpp"
#include "common/driver/run.hpp"

using namespace ringzero;

int main(int argc, char** argv) {
  Run run(argc, argv,
          {.name = "05_ddp_buckets",
           .title = "DDP with gradient buckets overlapped with backward, under mpirun",
           .trace = true});
  DDPFlags flags;
  return run.train<DDPTraining>(
      flags, [](auto& lesson, const Step& step) { return train_step(lesson.engine, step); });
}
