/* MPI_Allreduce bus bandwidth, the cross-check for scripts/bench.d/03-allreduce-bw.sh.
 *
 * For float32 sums of 4 KiB .. 64 MiB (x4 each row) on every rank: time per MPI_Allreduce
 * (median over repetitions, the slowest rank's), algorithm bandwidth algbw = bytes / time and
 * bus bandwidth busbw = algbw * 2(n-1)/n, the definitions of NVIDIA's nccl-tests
 * (doc/PERFORMANCE.md there): busbw is what each link carries, comparable across rank counts.
 * Last, rank 0's memcpy bandwidth on the largest size, the ceiling shared memory sets.
 * GB/s are decimal (1e9 bytes).
 *
 *   mpicc -O2 mpi_allreduce_bw.c -o allreduce_bw && mpirun -np 2 ./allreduce_bw
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int compare_doubles(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

/* Median seconds of `reps` calls of MPI_Allreduce on `count` floats, the maximum over ranks. */
static double time_allreduce(float* send, float* recv, size_t count, int reps) {
  double* t = malloc(sizeof(double) * reps);
  MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); /* warm-up */
  for (int r = 0; r < reps; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    double start = MPI_Wtime();
    MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    t[r] = MPI_Wtime() - start;
  }
  qsort(t, reps, sizeof(double), compare_doubles);
  double median = t[reps / 2], slowest;
  free(t);
  MPI_Allreduce(&median, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const size_t min_bytes = 4096, max_bytes = (size_t)64 << 20;
  float* send = malloc(max_bytes);
  float* recv = malloc(max_bytes);
  if (send == NULL || recv == NULL) {
    fprintf(stderr, "rank %d: cannot allocate 2 x %zu bytes\n", rank, max_bytes);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  for (size_t i = 0; i < max_bytes / sizeof(float); ++i) send[i] = (float)(i % 97) + rank;

  if (rank == 0) printf("%12s %10s %10s %10s\n", "bytes", "time_us", "algbw_GBs", "busbw_GBs");
  for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
    int reps = bytes >= ((size_t)16 << 20) ? 5 : 20;
    double t = time_allreduce(send, recv, bytes / sizeof(float), reps);
    double algbw = bytes / t / 1e9;
    if (rank == 0)
      printf("%12zu %10.1f %10.2f %10.2f\n", bytes, t * 1e6, algbw, algbw * 2.0 * (n - 1) / n);
  }

  if (rank == 0) {
    memcpy(recv, send, max_bytes); /* touch the pages first */
    double start = MPI_Wtime();
    for (int r = 0; r < 5; ++r) memcpy(recv, send, max_bytes);
    double t = (MPI_Wtime() - start) / 5;
    printf("memcpy %zu bytes: %.2f GB/s (read+write %.2f GB/s) check %.1f\n", max_bytes,
           max_bytes / t / 1e9, 2.0 * max_bytes / t / 1e9, (double)recv[7]);
  }
  free(send);
  free(recv);
  MPI_Finalize();
  return 0;
}
