// Chapter 04: ring all-reduce — every rank averages the gradients and steps its own optimizer.
//
//   mpirun -np 4 build/bin/ch04_ring_allreduce --epochs 5
//   mpirun -np 4 build/bin/ch04_ring_allreduce --collectives mpi    # MPI_Allreduce instead
//   mpirun -np 2 build/bin/ch04_ring_allreduce --bench-allreduce    # bus bandwidth, ours vs MPI
//
// Each rank trains on its 1/N of every global batch (K micro-steps each, as in chapter 02).
// After backward, each parameter's gradient is summed over ranks with a ring all-reduce
// (ring.hpp) and divided by N (step.hpp); every rank then takes the same optimizer
// step, so the weights stay identical without any broadcast. The numbers match chapter 03; the
// traffic printed at the end is the same on every rank, 2(N−1)/N·Ψ·4 bytes per step.
#include "chapters/04_ring_allreduce/step.hpp"
#include "common/driver/run.hpp"

using namespace ringzero;

int main(int argc, char** argv) {
  Run run(argc, argv,
          {.name = "04_ring_allreduce",
           .title = "data parallel with a ring all-reduce, every rank stepping, under mpirun"});
  RingDataParallel::Flags flags;
  return run.train<RingDataParallel>(flags, train_step);
}
