// data: Fashion-MNIST from its IDX .gz files, the synthetic regression set, and the
// sampler that decides which samples make up each optimizer step.
//
// Provides: read_idx_gz (validating), load_fashion_mnist, make_synthetic, Dataset::gather, and
// Sampler. The sampler is where the equivalence chain starts: the samples of optimizer step t
// depend only on (seed, epoch, t), never on world size or accumulation; ranks and micro-steps
// only cut that global batch into contiguous pieces.
// Leaves out: augmentation, prefetching, a DataLoader with workers.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/core/tensor.hpp"

namespace ringzero {

/// Where Debian's dataset-fashion-mnist (which scripts/setup installs) puts the four .gz files:
/// --data-dir's default.
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

/// An IDX array of unsigned bytes (LeCun et al., "THE MNIST DATABASE", file format section).
struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;  // product(dims) bytes, row-major
  uint32_t crc32 = 0;         ///< zlib crc32 of the decoded file (magic, dims, data), in order
  int64_t decoded_bytes = 0;  ///< bytes the crc32 covers
};

/// The largest IDX data section the reader accepts: 2^31 bytes (Fashion-MNIST's largest file
/// holds 47 MB). A header claiming more is rejected before anything is allocated.
inline constexpr int64_t kMaxIdxBytes = int64_t{1} << 31;

/// Reads a gzip-compressed IDX file of ubytes: decode_idx_gz on the file's bytes.
/// Errors: a missing file (names scripts/setup and --data-dir), and decode_idx_gz's.
IdxArray read_idx_gz(const std::string& path, int expected_ndim);

/// Decodes a gzip-compressed IDX file of ubytes held in memory; `file` names it in every
/// error. Checks: gzip magic, the gzip stream (a damaged deflate block or a CRC-32/length
/// trailer that does not match is reported as such, with zlib's reason), the IDX magic
/// (0x000008nn with nn = expected_ndim), a data size (product of the dimensions, checked
/// arithmetic) of at most kMaxIdxBytes, truncated data, trailing data. Memory grows with the
/// bytes actually decoded, never with what the header claims. The CRC-32 of the decoded bytes
/// is computed while reading (IdxArray::crc32).
IdxArray decode_idx_gz(std::span<const uint8_t> gz, const std::string& file, int expected_ndim);

/// A dataset in memory. Classification sets have labels, regression sets have targets.
struct Dataset {
  int64_t size = 0;
  int64_t in_features = 0;
  int64_t num_classes = 0;      ///< > 0 for classification
  int64_t out_features = 0;     ///< regression target width, or num_classes
  Buffer inputs;                ///< (size, in_features)
  Buffer targets;               ///< (size, out_features), regression only
  std::vector<int32_t> labels;  ///< (size), classification only
  /// Where the samples came from: "DIR train"/"DIR test" for Fashion-MNIST, the generator's
  /// parameters for the synthetic set. Named by the cross-rank data check.
  std::string source;
  /// zlib crc32 of the content: for Fashion-MNIST the decoded image file then the decoded
  /// label file (crc32_combine), for the synthetic set the float32 bytes of inputs then targets.
  /// Equal on every rank that loaded the same data.
  uint32_t crc32 = 0;

  bool classification() const { return num_classes > 0; }
  /// Copies samples `indices` into x (n, in_features) and, for regression, y (n, out_features)
  /// or, for classification, labels (n).
  void gather(std::span<const int64_t> indices, Tensor x, Tensor y,
              std::vector<int32_t>& batch_labels) const;
};

/// Fashion-MNIST train ("train-*") or test ("t10k-*") split from `dir`; pixels / 255 in [0, 1],
/// labels 0..9. Errors: a missing directory or file (names it and scripts/setup), a corrupt
/// file, image and label counts that differ, a label outside 0..9.
Dataset load_fashion_mnist(const std::string& dir, bool train);

/// The synthetic regression set: x (n, in) and y (n, out), all standard normal, from
/// (seed, stream). The ToyModel uses n = 1000, in = 1024, out = 256.
Dataset make_synthetic(int64_t n, int64_t in_features, int64_t out_features, uint64_t seed,
                       uint64_t stream);

/// Which dataset indices form each optimizer step. Per epoch: a permutation of [0, n) drawn
/// from (seed, epoch) by Fisher-Yates (identity with shuffle = false); step t uses positions
/// [t B, (t+1) B); the last partial batch is dropped (drop_last=True in PyTorch's DataLoader).
class Sampler {
 public:
  /// Errors: global_batch_size <= 0 or larger than the dataset.
  Sampler(int64_t dataset_size, int64_t global_batch_size, uint64_t seed, bool shuffle);
  int64_t steps_per_epoch() const { return dataset_size_ / global_batch_size_; }
  /// Prepares the order of `epoch` (cheap; call once per epoch).
  void set_epoch(int64_t epoch);
  /// The global batch of step t: global_batch_size indices.
  std::span<const int64_t> global_batch(int64_t step) const;
  /// Piece `chunk` of `num_chunks` equal contiguous pieces of step t's global batch. Rank r at
  /// micro-step k uses chunk r * grad_accum_steps + k of world_size * grad_accum_steps.
  std::span<const int64_t> chunk(int64_t step, int64_t chunk, int64_t num_chunks) const;

 private:
  int64_t dataset_size_, global_batch_size_;
  uint64_t seed_;
  bool shuffle_;
  std::vector<int64_t> order_;
};

/// The samples rank `rank` trains on at `micro_step` of global batch t: chunk
/// rank * grad_accum_steps + micro_step of world_size * grad_accum_steps equal pieces
/// (docs/design.md, "Samples per step depend only on (seed, epoch, t)"). Ranks and micro-steps only
/// cut the same global batch, so the set of samples of step t does not depend on world_size or
/// grad_accum_steps.
std::span<const int64_t> rank_micro_batch(const Sampler& sampler, int64_t t, int rank,
                                          int world_size, int64_t grad_accum_steps,
                                          int64_t micro_step);

}  // namespace ringzero
