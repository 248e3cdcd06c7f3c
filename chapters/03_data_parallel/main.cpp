// Chapter 03: data parallel with a central reducer — N processes, one optimizer on rank 0.
//
//   mpirun -np 4 build/bin/ch03_data_parallel --epochs 5
//   mpirun -np 4 build/bin/ch03_data_parallel --model toy --epochs 2
//
// Each rank trains on its 1/N of every global batch (K micro-steps each, as in chapter 02).
// Rank 0 collects every rank's gradients, averages them, steps the only optimizer and sends the
// new parameters back (step.hpp, central_reducer.hpp). The numbers match chapter 02 with K = N;
// rank 0's traffic, printed at the end, grows with N.
#include "chapters/03_data_parallel/step.hpp"
#include "common/driver/run.hpp"

using namespace ringzero;

int main(int argc, char** argv) {
  Run run(argc, argv,
          {.name = "03_data_parallel",
           .title = "data parallel with a central reducer (rank 0), under mpirun"});
  return run.train<CentralReducer>(train_step);
}
