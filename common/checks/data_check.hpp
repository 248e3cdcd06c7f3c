// data_check: every rank must train on the same data (issue 9, item 1).
//
// Provides: verify_same_data, the start-up check that compares, across ranks, the sample counts
// and the content fingerprints (Dataset::crc32, zlib's CRC-32 computed while the files were
// decoded) of the training and test sets, or the synthetic set's generator parameters. Ranks
// whose --data-dir holds different files would otherwise cut different global batches (a hang
// in a collective, MPI_ERR_TRUNCATE, or a silently wrong run).
// Leaves out: checking the files' bytes on disk (the decoded content is what training reads).
#pragma once

#include "common/comm/comm.hpp"
#include "common/driver/train.hpp"

namespace ringzero {

/// Collective, at start-up after load_data and before any other collective that depends on the
/// data. Gathers each rank's (source, size, crc32) of train and test on rank 0 and aborts every
/// rank with one message naming the first rank whose data differ from rank 0's: the split, both
/// directories (or synthetic parameters), both sample counts and both CRC-32 values, and the
/// fix. Two copies of the same files in different directories pass (only counts and content
/// are compared).
void verify_same_data(Communicator& comm, const TrainTestData& data);

/// The --seed entry for verify_same_flags' list of flags checked elsewhere (issue 9, item 2):
/// "seed" without --init-from, where the start-up parameter check catches a different seed
/// through the initial weights (chapter 03's lesson) and verify_same_data through the synthetic
/// set; "" (no flag skipped) with --init-from, where the weights no longer show the seed but it
/// still drives the sampler's shuffle, so the seed is compared as a flag.
inline const char* seed_checked_elsewhere(const TrainConfig& config) {
  return config.init_from.empty() ? "seed" : "";
}

}  // namespace ringzero
