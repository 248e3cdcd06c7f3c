// Chapter 01: the training loop — forward, loss, backward, optimizer step, zero grad.
//
//   build/bin/ch01_training_loop --epochs 5
//   build/bin/ch01_training_loop --model toy --epochs 2      # the ToyModel, synthetic data
//
// One process, one model, one optimizer. Every later chapter must reproduce the numbers this
// loop prints; the lesson is the loop body, train_step() in step.hpp.
#include "chapters/01_training_loop/step.hpp"
#include "chapters/01_training_loop/training_loop.hpp"
#include "common/driver/run.hpp"

using namespace ringzero;

int main(int argc, char** argv) {
  Run run(argc, argv,
          {.name = "01_training_loop",
           .title = "the training loop, on one process",
           .distributed = false,
           .grad_accum = false});
  return run.train<TrainingLoop>(train_step);
}
