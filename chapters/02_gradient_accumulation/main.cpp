// Chapter 02: gradient accumulation — K micro-batches, one optimizer step.
//
//   build/bin/ch02_gradient_accumulation --epochs 5 --grad-accum-steps 4
//   build/bin/ch02_gradient_accumulation --model toy --epochs 2 --grad-accum-steps 4
//
// The global batch B is cut into K micro-batches of B/K. Backward accumulates (+=), so running
// K backwards before one optimizer step sums K gradients; scaling each micro-batch loss by 1/K
// turns that sum into the gradient of the full-batch mean: the same step as chapter 01 with
// 1/K of the activation memory (step.hpp).
#include "chapters/01_training_loop/training_loop.hpp"
#include "chapters/02_gradient_accumulation/step.hpp"
#include "common/driver/run.hpp"

using namespace ringzero;

int main(int argc, char** argv) {
  Run run(argc, argv,
          {.name = "02_gradient_accumulation",
           .title = "gradient accumulation, on one process",
           .distributed = false});
  return run.train<TrainingLoop>(train_step);  // chapter 01's lesson object, this step
}
